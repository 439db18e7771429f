//! Compiles `src/codec/continuum.proto` with protox (a pure-Rust protobuf compiler), so that
//! building continuum never needs a system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/codec/continuum.proto");
    let descriptors = protox::compile(["continuum.proto"], ["src/codec"])?;
    // BTreeMap for every map field, so that encoding is deterministic (byte-identical contexts).
    prost_build::Config::new().btree_map(["."]).compile_fds(descriptors)?;
    Ok(())
}
