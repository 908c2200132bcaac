//! Compiles `proto/externalgrpc.proto` and `proto/relay.proto` with protox (no system `protoc`
//! needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The protocol file lives at the repository root, beside the tests that compare it.
    let protos = ["../../proto/externalgrpc.proto", "../../proto/relay.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["../../proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
