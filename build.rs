//! Records which nginx build the module was compiled against. nginx-sys exports
//! `DEP_NGINX_BUILD_DIR` only to its direct dependents, so this script is the one place that
//! knows where the matching nginx binary is; `make build` copies it from
//! `target/<profile>/nginx-build-dir`.

fn main() {
    println!("cargo::rerun-if-env-changed=DEP_NGINX_BUILD_DIR");
    // TLS to Redis (`ssl=on`) uses nginx's OpenSSL layer, which exists only in an nginx built
    // with an SSL module. nginx-sys lists the build's features to its direct dependents only.
    println!("cargo::rerun-if-env-changed=DEP_NGINX_FEATURES");
    println!("cargo::rustc-check-cfg=cfg(ngx_ssl)");
    let features = std::env::var("DEP_NGINX_FEATURES").unwrap_or_default();
    if features.split(',').any(|f| f == "ssl") {
        println!("cargo::rustc-cfg=ngx_ssl");
    }
    // Regex locations exist only in an nginx built with PCRE (src/glue/auth_target.rs walks them).
    println!("cargo::rustc-check-cfg=cfg(ngx_pcre)");
    // The RESP reference decoder (`codec::resp::decode`) is built for the tests and for the fuzz
    // crate, which sets this cfg, never into the module.
    println!("cargo::rustc-check-cfg=cfg(resp_reference)");
    if features.split(',').any(|f| f == "pcre") {
        println!("cargo::rustc-cfg=ngx_pcre");
    }
    if let (Ok(dir), Ok(out)) = (std::env::var("DEP_NGINX_BUILD_DIR"), std::env::var("OUT_DIR")) {
        // OUT_DIR is target/<profile>/build/<crate>-<hash>/out.
        if let Some(profile_dir) = std::path::Path::new(&out).ancestors().nth(3) {
            std::fs::write(profile_dir.join("nginx-build-dir"), dir)
                .expect("writing target/<profile>/nginx-build-dir");
        }
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo::rustc-link-arg=-undefined");
        println!("cargo::rustc-link-arg=dynamic_lookup");
    }
}
