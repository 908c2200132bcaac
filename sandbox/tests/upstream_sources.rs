//! Upstream sources on a machine without `../shared/upstream`: `tests/upstream/build.sh`
//! downloads cluster-autoscaler's release from its public repository and accepts it only with
//! the tree digest `tests/upstream/sources.lock` pins. The repository here is a local stand-in
//! serving the archive as GitHub's codeload does (`<owner>/<repo>/tar.gz/refs/tags/<tag>`, one
//! top directory holding the whole repository), made from the tree the sandbox already has.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// `KEY` of `tests/upstream/versions.env`.
fn version(key: &str) -> String {
    let text = std::fs::read_to_string(repo().join("tests/upstream/versions.env")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in versions.env"))
        .to_string()
}

/// Column `column` of `name`'s line in `tests/upstream/sources.lock`.
fn lock(name: &str, column: usize) -> String {
    let text = std::fs::read_to_string(repo().join("tests/upstream/sources.lock")).unwrap();
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&name))
        .unwrap_or_else(|| panic!("{name} in sources.lock"))[column - 1]
        .to_string()
}

/// Serves `archive` at `path` (anything else: 404) on loopback; the base URL and the count of
/// requests for `path`.
fn serve(path: String, archive: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let wanted = request.split_whitespace().nth(1) == Some(path.as_str());
            let head = if wanted {
                count.fetch_add(1, Ordering::SeqCst);
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/x-gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    archive.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into()
            };
            let _ = stream.write_all(head.as_bytes());
            if wanted {
                let _ = stream.write_all(&archive);
            }
        }
    });
    (base, served)
}

fn run(command: &mut Command) -> (bool, String) {
    let out = command.output().expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The archive of the whole `kubernetes/autoscaler` repository at `tag`, as codeload sends it:
/// `tree` as its `cluster-autoscaler/` directory, with what `../shared/upstream` leaves out (a
/// `vendor/` directory) and another project of the repository beside it; `tamper` changes one
/// file of the tree first.
fn archive(tree: &Path, tag: &str, tamper: bool) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join(format!("autoscaler-{tag}"));
    let ca = top.join("cluster-autoscaler");
    std::fs::create_dir_all(&top).unwrap();
    assert!(run(Command::new("cp").arg("-a").arg(tree).arg(&ca)).0);
    let _ = std::fs::remove_file(ca.join(".complete"));
    std::fs::create_dir_all(ca.join("vendor/example.com/x")).unwrap();
    std::fs::write(ca.join("vendor/example.com/x/x.go"), "package x\n").unwrap();
    std::fs::create_dir_all(top.join("vertical-pod-autoscaler")).unwrap();
    std::fs::write(top.join("vertical-pod-autoscaler/README.md"), "VPA\n").unwrap();
    if tamper {
        let main = ca.join("main.go");
        let mut text = std::fs::read_to_string(&main).unwrap();
        text.push_str("\n// one more line\n");
        std::fs::write(&main, text).unwrap();
    }
    let file = dir.path().join("archive.tar.gz");
    let (ok, out) = run(Command::new("tar")
        .arg("-czf")
        .arg(&file)
        .arg("-C")
        .arg(dir.path())
        .arg(format!("autoscaler-{tag}")));
    assert!(ok, "{out}");
    std::fs::read(&file).unwrap()
}

/// `build.sh ca-source` with no `../shared/upstream`, downloading from `base`, into `out`.
fn ca_source(base: &str, out: &Path) -> (bool, String) {
    let empty = out.join("no-shared-upstream");
    std::fs::create_dir_all(&empty).unwrap();
    run(Command::new("bash")
        .arg(repo().join("tests/upstream/build.sh"))
        .arg("ca-source")
        .env("UPSTREAM_OUT", out)
        .env("NGO_SHARED_UPSTREAM", &empty)
        .env("NGO_UPSTREAM_ARCHIVES", base))
}

#[test]
fn without_the_shared_tarball_the_pinned_release_is_downloaded_and_checked() {
    let ca = version("CA_VERSION");
    let name = format!("cluster-autoscaler-{ca}");
    let tag = name.clone();
    // The tree `make upstream` extracted (from ../shared/upstream, or downloaded).
    let tree = repo().join("target/upstream/work").join(&name);
    assert!(
        tree.join("go.mod").is_file(),
        "{} missing: run tests/upstream/build.sh ca-source",
        tree.display()
    );
    let path = format!("/kubernetes/autoscaler/tar.gz/refs/tags/{tag}");

    let (base, served) = serve(path.clone(), archive(&tree, &tag, false));
    let out = tempfile::tempdir().unwrap();
    let (ok, log) = ca_source(&base, out.path());
    assert!(ok, "{log}");
    assert!(
        log.contains("fetching cluster-autoscaler's source from"),
        "{log}"
    );
    let fetched = out.path().join("work").join(&name);
    assert!(fetched.join("go.mod").is_file() && fetched.join("main.go").is_file());
    assert!(!fetched.join("vendor").exists(), "vendor/ is left out");
    assert_eq!(
        std::fs::read_to_string(fetched.join(".complete"))
            .unwrap()
            .trim(),
        lock(&name, 2),
        "the cache keys are those of the shared tarball"
    );
    assert_eq!(served.load(Ordering::SeqCst), 1);
    // A second run uses what it fetched.
    let (ok, log) = ca_source(&base, out.path());
    assert!(ok, "{log}");
    assert_eq!(served.load(Ordering::SeqCst), 1, "{log}");

    // One changed file: refused, naming both digests, and nothing is left to build from.
    let (base, _) = serve(path, archive(&tree, &tag, true));
    let out = tempfile::tempdir().unwrap();
    let (ok, log) = ca_source(&base, out.path());
    assert!(!ok, "a tampered tree must be refused: {log}");
    assert!(
        log.contains("is not the pinned tree") && log.contains(&lock(&name, 3)),
        "{log}"
    );
    assert!(!out.path().join("work").join(&name).exists());

    // Nothing at that address: the error says where it looked and what else to do.
    let (base, _) = serve("/elsewhere".into(), Vec::new());
    let (ok, log) = ca_source(&base, tempfile::tempdir().unwrap().path());
    assert!(
        !ok && log.contains("cannot download") && log.contains(".tar.xz"),
        "{log}"
    );
}
