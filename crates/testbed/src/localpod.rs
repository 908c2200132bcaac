//! A container of a Pod run as a local process: the closest this sandbox gets to a kubelet on
//! a host without a container runtime. Used to run the Helm chart's Deployment and its
//! `helm test` hook exactly as rendered (same arguments, environment and files at the same
//! paths) against a sandbox API server.
//!
//! What the process sees, as in a Pod:
//! - the container's `command` and `args`, with `command[0]` (or the image's entrypoint) a
//!   local binary the caller names,
//!   its `env` (`value`, `fieldRef` to the Pod's name, namespace and ServiceAccount,
//!   `secretKeyRef`), `KUBERNETES_SERVICE_HOST`/`_PORT` of the API server;
//! - every Secret volume, read from the API server, at its `mountPath` (with `items` and
//!   `defaultMode`), and the ServiceAccount token (TokenRequest), the API server's CA and the
//!   namespace at `/var/run/secrets/kubernetes.io/serviceaccount` unless automounting is off;
//! - `/etc/hosts` resolving the names the caller lists (Service DNS names) to 127.0.0.1;
//! - a read-only root when the container asks for one, and the user of `runAsUser` or of the
//!   image (the caller says which).
//!
//! How: a private mount namespace (`unshare -m`) whose root is a copy-on-write overlay of the
//! host's root on a tmpfs, entered with `chroot`; nothing is written to the host, and the
//! mounts vanish with the process. Needs root (mount namespaces, overlayfs).
//!
//! Not emulated: images, network namespaces (ports are the host's, so a Service port must equal
//! the container port the process binds), resource limits, probes, `$(VAR)` expansion.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret, ServiceAccount};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Where Kubernetes mounts the ServiceAccount token.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One container of a Pod, to run locally.
#[derive(Clone, Debug)]
pub struct LocalPod {
    /// The Pod's name (`metadata.name`, the hostname, `fieldRef: metadata.name`).
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its spec, as rendered.
    pub spec: PodSpec,
    /// Which container to run.
    pub container: String,
    /// The local binary standing for the container's `command[0]`, or for the image's
    /// entrypoint when the container sets no command (the rest of `command`, then `args`,
    /// follow it).
    pub entrypoint: PathBuf,
    /// The image's user (`USER` in its Dockerfile), used unless `runAsUser` says otherwise;
    /// `None`: root.
    pub image_user: Option<(u32, u32)>,
    /// Names that resolve to 127.0.0.1 (Service DNS names).
    pub hosts: Vec<String>,
    /// The API server (`https://127.0.0.1:<port>`).
    pub api_server: String,
    /// The API server's CA (PEM), for the ServiceAccount mount.
    pub api_ca_pem: String,
}

/// A running local container; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct LocalPodProcess {
    child: Child,
    log: PathBuf,
    _root: tempfile::TempDir,
}

impl LocalPod {
    fn container_spec(&self) -> anyhow::Result<&Container> {
        self.spec
            .containers
            .iter()
            .find(|c| c.name == self.container)
            .with_context(|| format!("Pod {} has no container {}", self.name, self.container))
    }

    /// Reads volumes and credentials from the API server into `dir` and returns the command
    /// that runs the container, logging to `log`.
    async fn command(&self, client: &Client, dir: &Path, log: &Path) -> anyhow::Result<Command> {
        let container = self.container_spec()?;
        // `command[0]` (or the image's entrypoint) is `self.entrypoint`; the rest are arguments.
        let arguments: Vec<String> = container
            .command
            .iter()
            .flatten()
            .skip(1)
            .chain(container.args.iter().flatten())
            .cloned()
            .collect();
        let mut mounts: Vec<(PathBuf, String)> = Vec::new();
        let volumes = self.spec.volumes.clone().unwrap_or_default();
        for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
            let volume = volumes
                .iter()
                .find(|v| v.name == mount.name)
                .with_context(|| format!("volumeMount {} names no volume", mount.name))?;
            let Some(source) = &volume.secret else {
                bail!("volume {}: only Secret volumes are supported", volume.name);
            };
            let name = source.secret_name.clone().unwrap_or_default();
            let secret = Api::<Secret>::namespaced(client.clone(), &self.namespace)
                .get(&name)
                .await
                .with_context(|| {
                    format!(
                        "reading Secret {}/{name} of volume {}",
                        self.namespace, volume.name
                    )
                })?;
            let data: BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .chain(
                    secret
                        .string_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes())),
                )
                .collect();
            let local = dir.join(format!("volume-{index}"));
            std::fs::create_dir_all(&local)?;
            let mode = source.default_mode.unwrap_or(0o644) as u32;
            let files: Vec<(String, String, u32)> = match &source.items {
                Some(items) => items
                    .iter()
                    .map(|i| {
                        (
                            i.key.clone(),
                            i.path.clone(),
                            i.mode.map_or(mode, |m| m as u32),
                        )
                    })
                    .collect(),
                None => data.keys().map(|k| (k.clone(), k.clone(), mode)).collect(),
            };
            for (key, path, mode) in files {
                let bytes = data
                    .get(&key)
                    .with_context(|| format!("Secret {name} has no key {key}"))?;
                let file = local.join(&path);
                if let Some(parent) = file.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&file, bytes)?;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))?;
            }
            mounts.push((local, mount.mount_path.clone()));
        }
        if self.spec.automount_service_account_token != Some(false) {
            let account = self
                .spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into());
            let token = mint_token(client, &self.namespace, &account).await?;
            let local = dir.join("serviceaccount");
            std::fs::create_dir_all(&local)?;
            for (file, text) in [
                ("token", token.as_str()),
                ("ca.crt", self.api_ca_pem.as_str()),
                ("namespace", self.namespace.as_str()),
            ] {
                std::fs::write(local.join(file), text)?;
                std::fs::set_permissions(local.join(file), std::fs::Permissions::from_mode(0o644))?;
            }
            mounts.push((local, SERVICE_ACCOUNT_DIR.into()));
        }

        let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        hosts.push_str(&format!("127.0.0.1 {}\n", self.hosts.join(" ")));
        let hosts_file = dir.join("hosts");
        std::fs::write(&hosts_file, hosts)?;

        let env = self.environment(client, container).await?;
        let read_only = container
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false);
        let user = container
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or_else(|| {
                self.spec
                    .security_context
                    .as_ref()
                    .and_then(|s| s.run_as_user)
            })
            .map(|uid| (uid as u32, uid as u32))
            .or(self.image_user);

        let root = dir.join("root");
        std::fs::create_dir_all(&root)?;
        let q = |p: &Path| shell_quote(&p.display().to_string());
        let mut script = String::from("set -e\n");
        script.push_str(&format!("mount -t tmpfs tmpfs {}\n", q(&root)));
        script.push_str(&format!(
            "mkdir {r}/upper {r}/work {r}/root\n\
             mount -t overlay overlay -o lowerdir=/,upperdir={r}/upper,workdir={r}/work {r}/root\n\
             for m in /proc /dev /sys; do mount --rbind $m {r}/root$m; done\n",
            r = q(&root)
        ));
        for (local, path) in &mounts {
            let target = root.join("root").join(resolve_in_root(Path::new(path)));
            script.push_str(&format!(
                "mkdir -p {t}\nmount --bind -o ro {l} {t}\n",
                t = q(&target),
                l = q(local)
            ));
        }
        script.push_str(&format!(
            "cat {} > {}\n",
            q(&hosts_file),
            q(&root
                .join("root")
                .join(resolve_in_root(Path::new("/etc/hosts"))))
        ));
        if Path::new("/etc/resolv.conf").exists() {
            script.push_str(&format!(
                "touch {t}; mount --bind /etc/resolv.conf {t}\n",
                t = q(&root
                    .join("root")
                    .join(resolve_in_root(Path::new("/etc/resolv.conf"))))
            ));
        }
        if read_only {
            script.push_str(&format!("mount -o remount,ro {}\n", q(&root.join("root"))));
        }
        let userspec = match user {
            Some((uid, gid)) => format!("--userspec={uid}:{gid} "),
            None => String::new(),
        };
        script.push_str(&format!(
            "exec chroot {userspec}{} \"$@\"\n",
            q(&root.join("root"))
        ));

        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new("unshare");
        command
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                "sh",
            ])
            .arg(&self.entrypoint)
            .args(&arguments)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        Ok(command)
    }

    async fn environment(
        &self,
        client: &Client,
        container: &Container,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let (host, port) = self
            .api_server
            .trim_start_matches("https://")
            .rsplit_once(':')
            .context("API server URL is not https://host:port")?;
        let mut env = vec![
            (
                "PATH".to_string(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOSTNAME".into(), self.name.clone()),
            // Not the test's home: a kubeconfig there would win over the in-cluster config.
            ("HOME".into(), "/home/nonroot".into()),
            ("KUBERNETES_SERVICE_HOST".into(), host.to_string()),
            ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
            ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
        ];
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => {
                    if let Some(field) = &from.field_ref {
                        match field.field_path.as_str() {
                            "metadata.name" => self.name.clone(),
                            "metadata.namespace" => self.namespace.clone(),
                            // Runs on no Node of the sandbox: the Pod's own, when it names one.
                            "spec.nodeName" => self.spec.node_name.clone().unwrap_or_default(),
                            "spec.serviceAccountName" => self
                                .spec
                                .service_account_name
                                .clone()
                                .unwrap_or_else(|| "default".into()),
                            other => bail!("env {}: fieldRef {other} is not supported", var.name),
                        }
                    } else if let Some(key) = &from.secret_key_ref {
                        let secret = Api::<Secret>::namespaced(client.clone(), &self.namespace)
                            .get(&key.name)
                            .await?;
                        let bytes = secret
                            .data
                            .and_then(|d| d.get(&key.key).cloned())
                            .with_context(|| {
                                format!("Secret {} has no key {}", key.name, key.key)
                            })?;
                        String::from_utf8(bytes.0)?
                    } else {
                        bail!(
                            "env {}: only fieldRef and secretKeyRef are supported",
                            var.name
                        );
                    }
                }
                (None, None) => String::new(),
            };
            env.push((var.name.clone(), value));
        }
        Ok(env)
    }

    /// Starts the container; it runs until stopped or dropped. Its output goes to `log`.
    pub async fn start(&self, client: &Client, log: &Path) -> anyhow::Result<LocalPodProcess> {
        let root = tempfile::Builder::new()
            .prefix(&format!("ngo-localpod-{}-", self.name))
            .tempdir()?;
        let mut command = self.command(client, root.path(), log).await?;
        let child = command
            .spawn()
            .with_context(|| format!("starting Pod {} (unshare)", self.name))?;
        Ok(LocalPodProcess {
            child,
            log: log.to_path_buf(),
            _root: root,
        })
    }

    /// Runs the container to completion (killed after `timeout`): its exit status and
    /// output.
    pub async fn run(
        &self,
        client: &Client,
        log: &Path,
        timeout: Duration,
    ) -> anyhow::Result<(ExitStatus, String)> {
        let mut process = self.start(client, log).await?;
        let start = Instant::now();
        let status = loop {
            if let Some(status) = process.child.try_wait()? {
                break status;
            }
            if start.elapsed() > timeout {
                process.stop(Duration::from_secs(1));
                bail!(
                    "Pod {} still running after {timeout:?}:\n{}",
                    self.name,
                    process.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Ok((status, process.output()))
    }
}

impl LocalPodProcess {
    /// Its output so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails, with the output, if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("exited with {status}:\n{}", self.output());
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for LocalPodProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Reports a finished container on its Pod's status, as a kubelet does: phase `Succeeded` or
/// `Failed` and the container's terminated state.
pub async fn report_completion(
    client: &Client,
    pod: &Pod,
    container: &str,
    status: ExitStatus,
) -> anyhow::Result<()> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let code = status.code().unwrap_or(137);
    let now = jiff::Timestamp::now().to_string();
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == container))
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let patch = json!({"status": {
        "phase": if code == 0 { "Succeeded" } else { "Failed" },
        "startTime": now,
        "containerStatuses": [{
            "name": container,
            "image": image,
            "imageID": "",
            "ready": false,
            "restartCount": 0,
            "state": {"terminated": {
                "exitCode": code,
                "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": now,
                "finishedAt": now,
            }},
        }],
    }});
    Api::<Pod>::namespaced(client.clone(), &namespace)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("reporting the completion of Pod {namespace}/{name}"))?;
    Ok(())
}

async fn mint_token(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?;
    issued
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .with_context(|| format!("no token for ServiceAccount {namespace}/{name}"))
}

/// `path` with the symbolic links of its existing part resolved as the new root sees them.
/// The new root's lower layer is the host's `/`, so the host resolves them the same way; a
/// path through a link (`/var/run` -> `/run`) must not be followed from outside the new root,
/// where an absolute target would point at the host's directory. Returned relative to `/`.
fn resolve_in_root(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut resolved = std::fs::canonicalize(&existing).unwrap_or(existing);
    resolved.extend(rest.iter().rev());
    resolved
        .strip_prefix("/")
        .map(Path::to_path_buf)
        .unwrap_or(resolved)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
