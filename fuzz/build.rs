//! The fuzz crate compiles the module's RESP decoder (`#[path]`) with its reference decoder
//! (`decode`), which the module itself leaves out.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(resp_reference)");
    println!("cargo::rustc-cfg=resp_reference");
}
