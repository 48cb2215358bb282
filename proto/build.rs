//! Generates the CRI v1 messages and the tonic server and client from `runtime/v1/api.proto`,
//! the NRI and ttrpc messages from `nri/`, and clients of the two containerd services `crius
//! images import --from-containerd` uses (`containerd/*.proto`, a subset written for crius).
//! protox parses the protos in Rust, so a machine needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // An RPC that has no handler yet answers Unimplemented instead of failing the build.
        .generate_default_stubs(true)
        // A request that does not decode is InvalidArgument (see `src/codec.rs`).
        .codec_path("crate::codec::CriCodec")
        .compile_fds(fds)?;

    // NRI: messages only; crius frames them itself (ttrpc over a multiplexed unix socket).
    let nri = ["nri/api.proto", "nri/ttrpc.proto"];
    for p in nri {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(nri, ["."])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_fds(fds)?;

    let containerd = ["containerd/images.proto", "containerd/content.proto"];
    for proto in containerd {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(containerd, ["."])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
