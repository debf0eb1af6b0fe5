//! The edge's OCI image, built by `image/build.sh` from this build's binary and run
//! with a real OCI runtime (runc) the way a cluster runs it: as user 65532, with no
//! capabilities and a read-only root filesystem, its manifests on a read-only mount.
//! A request through it must reach a real backend. The container shares the host's
//! network namespace, so it binds this test's loopback addresses (nothing else).

use std::path::Path;
use std::process::Command;

use http::StatusCode;
use serde_json::{Value, json};

use crate::common::*;

/// `runc delete --force` on drop: killing the foreground `runc run` alone would leave
/// the container's process running.
struct Container {
    runc: std::path::PathBuf,
    id: String,
}

impl Container {
    /// The container's init process as the host sees it.
    fn pid(&self) -> Result<u32, BoxError> {
        let out = Command::new(&self.runc)
            .args(["state", &self.id])
            .output()?;
        ensure!(
            out.status.success(),
            "runc state: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let state: Value = serde_json::from_slice(&out.stdout)?;
        let pid = state["pid"].as_u64().ok_or("runc state without a pid")?;
        Ok(u32::try_from(pid)?)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.runc)
            .args(["delete", "--force", &self.id])
            .output();
    }
}

/// The runtime configuration umoci derived from the image, as a restricted pod runs
/// it: no capabilities, read-only root, a tmpfs /tmp, the manifests mounted read-only,
/// the host's network namespace (loopback), and `args` after the image's entrypoint.
fn restrict(config: &mut Value, manifests: &Path, args: &[String]) -> TestResult {
    let process = &mut config["process"];
    process["terminal"] = json!(false);
    let entrypoint = process["args"][0].clone();
    ensure!(
        entrypoint == json!("/usr/local/bin/aether-edge"),
        "the image's entrypoint is {entrypoint}"
    );
    let mut argv = vec![entrypoint];
    argv.extend(args.iter().map(|a| json!(a)));
    process["args"] = json!(argv);
    if let Some(caps) = process["capabilities"].as_object_mut() {
        for set in caps.values_mut() {
            *set = json!([]);
        }
    }
    config["root"]["readonly"] = json!(true);
    let namespaces = config["linux"]["namespaces"]
        .as_array_mut()
        .ok_or("no linux.namespaces")?;
    namespaces.retain(|n| n["type"] != "network");
    let mounts = config["mounts"].as_array_mut().ok_or("no mounts")?;
    mounts.push(json!({"destination": "/etc/aether", "type": "bind",
                       "source": manifests, "options": ["rbind", "ro"]}));
    mounts.push(
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777"]}),
    );
    Ok(())
}

fn run(cmd: &mut Command) -> TestResult {
    let out = cmd.output()?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test]
async fn the_image_serves_as_non_root_on_a_read_only_root() -> TestResult {
    let Some(runc) = aether_test_support::test_tool(
        "tests/image/tools.sh",
        "no runc, umoci or skopeo (or not root)",
    )?
    else {
        return Ok(());
    };
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    env.write_manifest("infra.yaml", &standard_infra(net))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "image",
            "edge",
            &["image.example.com"],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;

    let layout = env.dir.path().join("oci");
    run(Command::new("bash")
        .arg(aether_test_support::repo_root().join("image/build.sh"))
        .arg(env!("CARGO_BIN_EXE_aether-edge"))
        .arg(&layout)
        .arg("test"))?;
    // The docker-archive `docker load` and containerd take, read back by skopeo.
    let archive = format!("docker-archive:{}.tar", layout.display());
    let out = Command::new("skopeo")
        .args(["--insecure-policy", "inspect", "--config", &archive])
        .output()?;
    ensure!(
        out.status.success(),
        "skopeo inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image_config: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(image_config["config"]["User"], json!("65532:65532"));
    assert_eq!(
        image_config["config"]["Cmd"],
        json!(["run", "--kubernetes"])
    );

    let bundle = env.dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:test", layout.display()))
        .arg(&bundle))?;
    let rootfs = bundle.join("rootfs");
    ensure!(
        rootfs.join("usr/local/bin/aether-edge").is_file(),
        "no binary in the image"
    );
    for shell in ["bin/sh", "bin/bash", "usr/bin/sh"] {
        ensure!(!rootfs.join(shell).exists(), "the image has {shell}");
    }
    let config_path = bundle.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path)?)?;
    let args: Vec<String> = [
        "run",
        "--manifests",
        "/etc/aether",
        "--admin",
        &net.admin().to_string(),
        "--address-pool",
        &net.pool(),
        "--drain-timeout",
        "5s",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    restrict(&mut config, &env.manifests(), &args)?;
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;

    let container = Container {
        runc: runc.clone(),
        id: format!("aether-image-test-{}-{}", net.b, net.k),
    };
    let mut cmd = Command::new(&runc);
    cmd.args(["run", "--bundle"])
        .arg(&bundle)
        .arg(&container.id);
    let mut edge = env.spawn_cmd(cmd, "edge-in-runc")?;
    env.wait_ready(&mut edge).await?;
    env.wait_listener(gw).await?;

    let r = env
        .h1(gw, "image.example.com", "/through/the/image")
        .await?;
    ensure!(r.status == StatusCode::OK, "answered {}", r.status);
    let seen = env.echo_requests("a")?;
    ensure!(
        seen.iter().any(|e| e.path() == "/through/the/image"),
        "the backend did not see the request: {seen:?}"
    );

    // What the kernel says of the process that served it.
    let pid = container.pid()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::split_whitespace)
            .map(|f| f.collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(field("Uid:"), ["65532"; 4], "{status}");
    assert_eq!(field("Gid:"), ["65532"; 4], "{status}");
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{status}");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let root_options = mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .and_then(|f| f.get(5).map(|o| o.to_string()))
        .ok_or("no root mount")?;
    ensure!(
        root_options.split(',').any(|o| o == "ro"),
        "the root filesystem is mounted {root_options}"
    );
    drop(container);
    drop(edge);
    env.pass()
}
