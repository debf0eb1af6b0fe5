//! Generates the Workload API server from proto/workload.proto (copied unchanged from
//! the `spiffe` crate, which ships only the client side).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/workload.proto");
    let fds = protox::compile(["workload.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .compile_fds(fds)?;
    Ok(())
}
