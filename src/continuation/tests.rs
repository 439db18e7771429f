//! Unit tests of continuations.
