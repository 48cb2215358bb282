//! Builds the static `crius-pause` (see `src/bin/crius-pause.rs`) into `OUT_DIR`.
//!
//! Cargo cannot give one binary of a package its own panic strategy or link mode, so the
//! static, `no_std` build of the pause program is made here with the same `rustc` cargo uses;
//! `crius-shim` embeds it (`--install-pause`) and tests find it through `CRIUS_PAUSE_STATIC`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "src/bin/crius-pause.rs";
    println!("cargo::rerun-if-changed={src}");
    println!("cargo::rustc-check-cfg=cfg(static_pause)");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"))
        .join("crius-pause");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").expect("cargo sets TARGET for build scripts");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "bin",
            "--crate-name",
            "crius_pause",
        ])
        .args(["--target", &target, "--cfg", "static_pause"])
        .args([
            "-C",
            "panic=abort",
            "-C",
            "opt-level=s",
            "-C",
            "relocation-model=static",
        ])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib"])
        .args(["-C", "link-arg=-static", "-C", "strip=symbols"])
        .arg(src)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run rustc for the static crius-pause");
    assert!(status.success(), "building the static crius-pause failed");
    println!("cargo::rustc-env=CRIUS_PAUSE_STATIC={}", out.display());

    // The helper is exec'd for every create and exec, and lives a few milliseconds: as a
    // position-independent executable the loader first applied its ~14,000 relative
    // relocations, copying every page they touch (160 page faults, 0.87 ms of CPU for an
    // exec that does nothing; 90 and 0.68 ms linked at a fixed address). Its libraries, stack
    // and heap stay randomized; the long-lived crius-shim stays a PIE.
    println!("cargo::rustc-link-arg-bin=crius-shim-helper=-no-pie");

    // The installed shim and helper are linked statically (`make build-release` builds them
    // with `-C target-feature=+crt-static` for an explicit `--target`; docs/performance.md,
    // "Static binaries"): rustc then asks for a static PIE, which the `-no-pie` above cancels
    // altogether (the helper came out dynamic); `-static` after it makes it static and at a
    // fixed address, nothing for the loader to do.
    let crt_static = env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|features| features.split(',').any(|f| f == "crt-static"));
    if crt_static {
        println!("cargo::rustc-link-arg-bin=crius-shim-helper=-static");
    }
}
