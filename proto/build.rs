//! Digest of the IPC message definitions, so that two builds whose messages
//! differ refuse each other at the handshake instead of misreading frames.
use std::hash::{DefaultHasher, Hasher};

fn main() {
    let mut h = DefaultHasher::new();
    for f in ["src/msg.rs", "src/outcome.rs", "src/frame.rs", "src/task.rs", "src/keys.rs"] {
        println!("cargo:rerun-if-changed={f}");
        match std::fs::read(f) {
            Ok(bytes) => h.write(&bytes),
            Err(e) => panic!("build script cannot read {f}: {e}"),
        }
    }
    println!("cargo:rustc-env=SNOWLUMA_PROTO_DIGEST={:016x}", h.finish());
}
