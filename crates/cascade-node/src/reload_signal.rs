//! SIGHUP, one for the whole process: a generation count that every file
//! watcher of the process follows (each node's policy file and schema
//! file), so one signal reloads both, and a test process (many nodes, no
//! signal) asks with [`request_reload`].

use std::sync::OnceLock;

use tokio::sync::watch;
use tracing::{info, warn};

fn requests() -> &'static watch::Sender<u64> {
    static REQUESTS: OnceLock<watch::Sender<u64>> = OnceLock::new();
    REQUESTS.get_or_init(|| watch::channel(0).0)
}

/// What a file watcher follows: it reads its file again at every change.
pub(crate) fn subscribe() -> watch::Receiver<u64> {
    requests().subscribe()
}

/// Asks every node of this process to read its policy and schema files
/// again now, changed or not (what SIGHUP does in `cascade serve`).
pub fn request_reload() {
    requests().send_modify(|generation| *generation = generation.wrapping_add(1));
}

/// Calls [`request_reload`] on every SIGHUP for as long as the process
/// runs. Only the `cascade serve` binary installs it: a test process runs
/// many nodes and reloads by rewriting their files or calling.
pub fn reload_on_sighup() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(mut hangups) => {
                tokio::spawn(async move {
                    while hangups.recv().await.is_some() {
                        info!("SIGHUP: reading the policy and schema files again");
                        request_reload();
                    }
                });
            }
            Err(e) => warn!(
                error = %e,
                "cannot listen for SIGHUP: the policy and the schema reload only when their files change"
            ),
        }
    }
}
