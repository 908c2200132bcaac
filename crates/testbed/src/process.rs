//! Child processes that log to a file, die with their parent, and are stopped on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process failure.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The binary is missing.
    #[error("{binary} not found; build the upstream peers first: tests/upstream/build.sh")]
    Missing {
        /// Path looked at.
        binary: PathBuf,
    },
    /// Spawning or logging failed.
    #[error("starting {name}: {source}")]
    Spawn {
        /// Process name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The process exited before it was ready.
    #[error("{name} exited with {status} before becoming ready; last log lines:\n{log_tail}")]
    Exited {
        /// Process name.
        name: String,
        /// Exit status.
        status: std::process::ExitStatus,
        /// End of its log.
        log_tail: String,
    },
    /// The process did not become ready in time.
    #[error("{name} not ready after {waited:?}; last log lines:\n{log_tail}")]
    NotReady {
        /// Process name.
        name: String,
        /// How long we waited.
        waited: Duration,
        /// End of its log.
        log_tail: String,
    },
}

/// A running child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct ManagedProcess {
    name: String,
    /// Behind a lock so that liveness checks need only a shared reference.
    child: std::sync::Mutex<Child>,
    log: PathBuf,
    binary: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
}

impl ManagedProcess {
    /// Starts `binary args...`, logging stdout and stderr to `<log_dir>/<name>.log`. On Linux
    /// the child receives SIGKILL when the spawning thread exits, so a crashed test leaks
    /// nothing: spawn from a thread that lives as long as the sandbox should.
    pub fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log_dir: &Path,
    ) -> Result<Self, ProcessError> {
        if !binary.exists() {
            return Err(ProcessError::Missing {
                binary: binary.into(),
            });
        }
        let log = log_dir.join(format!("{name}.log"));
        let envs: Vec<(String, String)> = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let child = launch(name, binary, args, &envs, &log, false)?;
        Ok(Self {
            name: name.into(),
            child: std::sync::Mutex::new(child),
            log,
            binary: binary.into(),
            args: args.to_vec(),
            envs,
        })
    }

    /// Stops the process if it still runs (SIGTERM, SIGKILL after `grace`) and starts the
    /// same command again, appending to the same log. The same rule as for
    /// [`ManagedProcess::spawn`] applies: the new child dies with the calling thread.
    pub fn respawn(&mut self, grace: Duration) -> Result<(), ProcessError> {
        self.stop(grace);
        let child = launch(
            &self.name,
            &self.binary,
            &self.args,
            &self.envs,
            &self.log,
            true,
        )?;
        *self.child.get_mut().unwrap_or_else(|p| p.into_inner()) = child;
        Ok(())
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Process id.
    pub fn id(&self) -> u32 {
        self.child().id()
    }

    /// Process name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Last lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Fails if the process has exited.
    pub fn check_alive(&self) -> Result<(), ProcessError> {
        let exited = self.child().try_wait();
        match exited {
            Ok(Some(status)) => Err(ProcessError::Exited {
                name: self.name.clone(),
                status,
                log_tail: self.log_tail(30),
            }),
            _ => Ok(()),
        }
    }

    /// Polls `probe` until it returns true, the process exits, or `timeout` passes.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> Result<(), ProcessError> {
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if probe() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(ProcessError::NotReady {
                    name: self.name.clone(),
                    waited: timeout,
                    log_tail: self.log_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the process: SIGTERM, then SIGKILL after `grace`. Returns how it exited when
    /// it did so by itself (`None`: it had to be killed).
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        #[cfg(unix)]
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        let _ = self.stop(Duration::from_secs(5));
    }
}

/// Spawns `binary args...` with stdout and stderr to `log` (appended or truncated), in a
/// process group of its own, receiving SIGKILL when the calling thread exits (Linux).
fn launch(
    name: &str,
    binary: &Path,
    args: &[String],
    envs: &[(String, String)],
    log: &Path,
    append: bool,
) -> Result<Child, ProcessError> {
    let spawn_err = |source| ProcessError::Spawn {
        name: name.into(),
        source,
    };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .map_err(spawn_err)?;
    let err = out.try_clone().map_err(spawn_err)?;
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    command
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    for (k, v) in envs {
        command.env(k, v);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl and setpgid are async-signal-safe and touch no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // A process group of its own: a terminal's Ctrl-C reaches the sandbox,
                // which then stops its children in order.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command.spawn().map_err(spawn_err)
}

/// A free TCP port on 127.0.0.1 (racy by nature; callers retry on bind failures).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// True when `GET http://<addr><path>` answers 200 (plain HTTP/1.0).
pub fn http_ok(addr: SocketAddr, path: &str) -> bool {
    http_get(addr, path).is_ok()
}

/// The body of `GET http://<addr><path>` (plain HTTP/1.0); an error unless it answers 200.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default();
    if status.starts_with("HTTP/1.0 200") || status.starts_with("HTTP/1.1 200") {
        Ok(body.to_string())
    } else {
        Err(std::io::Error::other(format!(
            "GET {path} on {addr}: {status}"
        )))
    }
}
