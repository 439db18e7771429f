//! `continuum._continuum`: the extension module behind the `continuum` Python package. It is
//! thin by design: it converts values, releases the GIL around every call that can wait on
//! the disk, and maps errors to `continuum.errors`; the logic is the Rust store's.

mod convert;
mod errors;
mod options;
mod store;

use pyo3::prelude::*;

/// The native part of the `continuum` package; import `continuum` instead.
#[pymodule]
fn _continuum(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<store::PyStore>()?;
    module.add_class::<store::PyExecuted>()?;
    module.add_class::<store::PyHistory>()?;
    module.add_class::<convert::PyAtom>()?;
    Ok(())
}
