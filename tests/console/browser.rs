//! A real headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol: one WebSocket (tokio-tungstenite) to the browser's
//! endpoint, one page attached in flat mode, and the four commands the
//! tests need (`Target.createTarget`, `Target.attachToTarget`,
//! `Page.navigate`, `Runtime.evaluate`). A page is read with JavaScript
//! evaluated in it, so one page session is read as often as a test likes
//! (counts rising without a reload).
//!
//! Without Chromium, [`Browser::launch`] returns None after saying on
//! stderr that the browser tests were skipped and how to install it; with
//! `CASCADE_TEST_CHROMIUM_REQUIRED=1` (CI) that is a failure instead.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Set to `1` (CI): a missing Chromium fails the tests instead of skipping them.
pub const REQUIRED_ENV: &str = "CASCADE_TEST_CHROMIUM_REQUIRED";

/// How long one DevTools command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The browser's binary: `CASCADE_CHROMIUM`, else `chromium` (Debian) or
/// `chromium-browser` on the PATH.
fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CASCADE_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Chromium refuses to run as root with its sandbox on.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next().map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

pub struct Browser {
    child: Child,
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// A headless Chromium with one blank page, or None (skipped) when
    /// the machine has none.
    pub async fn launch(test: &str) -> Option<Browser> {
        let Some(binary) = find_chromium() else {
            if std::env::var(REQUIRED_ENV).is_ok_and(|v| v == "1") {
                panic!(
                    "the console's browser tests need Chromium and {REQUIRED_ENV}=1: \
                     apt-get install chromium (Debian), or set CASCADE_CHROMIUM"
                );
            }
            // Straight to the process's stderr: libtest captures the
            // output of a passing test, and this must be seen.
            let line = format!(
                "skipped: the console's browser test {test} needs Chromium: \
                 apt-get install chromium (Debian), or set CASCADE_CHROMIUM\n"
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
            return None;
        };
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut command = Command::new(&binary);
        command
            .args([
                "--headless",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                // The demo's and the tests' nodes present a certificate of
                // a development CA the browser does not know.
                "--ignore-certificate-errors",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()));
        if running_as_root() {
            command.arg("--no-sandbox");
        }
        command
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let stderr = child.stderr.take().expect("piped stderr");
        // The endpoint is the line "DevTools listening on ws://…"; the
        // rest of stderr is drained so the browser never blocks on it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(url.trim().to_owned());
                    }
                }
            }
        });
        let url = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30)))
            .await
            .expect("the reader of Chromium's stderr")
            .unwrap_or_else(|e| panic!("Chromium printed no DevTools endpoint within 30 s: {e}"));
        let (socket, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap_or_else(|e| panic!("DevTools at {url}: {e}"));
        let mut browser = Browser {
            child,
            socket,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = browser
            .command("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target_id = target["targetId"].as_str().expect("a target id").to_owned();
        let attached = browser
            .command(
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
            )
            .await;
        browser.session = attached["sessionId"].as_str().expect("a session id").to_owned();
        browser.command("Page.enable", json!({})).await;
        browser.command("Runtime.enable", json!({})).await;
        Some(browser)
    }

    /// Sends one command (to the page once attached) and waits for its
    /// answer, skipping the events in between.
    async fn command(&mut self, method: &str, params: Value) -> Value {
        self.try_command(method, params)
            .await
            .unwrap_or_else(|error| panic!("DevTools {method}: {error}"))
    }

    /// [`Browser::command`], with the browser's refusal as an error (a
    /// page navigating away refuses an evaluation in the page it leaves).
    async fn try_command(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .unwrap_or_else(|e| panic!("DevTools {method}: {e}"));
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = tokio::time::timeout(left, self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools {method}: no answer within {COMMAND_TIMEOUT:?}"));
            let Some(Ok(Message::Text(text))) = next else {
                match next {
                    Some(Ok(_)) => continue,
                    other => panic!("DevTools {method}: the connection ended: {other:?}"),
                }
            };
            let answer: Value = serde_json::from_str(text.as_str()).expect("DevTools speaks JSON");
            if answer["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(error) = answer.get("error") {
                return Err(error.to_string());
            }
            return Ok(answer["result"].clone());
        }
    }

    /// Opens `url` in the page and waits until it has loaded.
    pub async fn goto(&mut self, url: &str) {
        let navigated = self.command("Page.navigate", json!({ "url": url })).await;
        if let Some(error) = navigated.get("errorText") {
            panic!("navigating to {url}: {error}");
        }
        self.wait_for(
            &format!("loading {url}"),
            Duration::from_secs(20),
            "document.readyState === 'complete'",
        )
        .await;
    }

    /// The value of a JavaScript expression evaluated in the page (a
    /// promise is awaited); an exception is a panic naming it.
    pub async fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression)
            .await
            .unwrap_or_else(|error| panic!("evaluating {expression}: {error}"))
    }

    async fn try_eval(&mut self, expression: &str) -> Result<Value, String> {
        let answer = self
            .try_command(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await?;
        if let Some(exception) = answer.get("exceptionDetails") {
            return Err(exception.to_string());
        }
        Ok(answer["result"]["value"].clone())
    }

    /// The text of the first element `selector` matches, if any.
    pub async fn text(&mut self, selector: &str) -> Option<String> {
        let selector = serde_json::to_string(selector).expect("a string");
        self.eval(&format!("document.querySelector({selector})?.textContent ?? null"))
            .await
            .as_str()
            .map(str::to_owned)
    }

    /// With `CASCADE_CONSOLE_SCREENSHOTS=DIR`, saves what the page shows
    /// as `DIR/NAME.png` (for the docs and for a person to look at);
    /// without it, nothing.
    pub async fn screenshot(&mut self, name: &str) {
        let Some(dir) = std::env::var_os("CASCADE_CONSOLE_SCREENSHOTS") else {
            return;
        };
        self.command(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let shot = self
            .command(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": true }),
            )
            .await;
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("a screenshot"))
            .expect("base64");
        let path = PathBuf::from(dir).join(format!("{name}.png"));
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("the screenshots' directory");
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Polls `expression` until it is truthy, within `limit`.
    pub async fn wait_for(&mut self, what: &str, limit: Duration, expression: &str) -> Value {
        let started = Instant::now();
        loop {
            // Between two documents an evaluation is refused: not yet.
            let value = self
                .try_eval(&format!(
                    "(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()"
                ))
                .await
                .unwrap_or(Value::Null);
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            if started.elapsed() > limit {
                let body = self
                    .try_eval("document.body ? document.body.innerText : ''")
                    .await
                    .unwrap_or_else(Value::String);
                panic!("timed out after {limit:?} waiting for {what} ({expression}); the page reads:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How long the page now shown took to load, as the browser measured it
/// (Navigation Timing: navigation start to the end of the `load` event),
/// and the size of its HTML as received (decoded body bytes).
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    pub took: Duration,
    pub html_bytes: u64,
}

impl Browser {
    /// [`Loaded`] of the current document, once its `load` event has ended.
    pub async fn loaded(&mut self) -> Loaded {
        let timing = self
            .wait_for(
                "the navigation's timing",
                Duration::from_secs(20),
                "(() => { const n = performance.getEntriesByType('navigation')[0]; \
                 return n && n.loadEventEnd > 0 ? [n.loadEventEnd - n.startTime, n.decodedBodySize] : null; })()",
            )
            .await;
        let millis = timing[0].as_f64().expect("a duration in ms");
        Loaded {
            took: Duration::from_secs_f64(millis / 1000.0),
            html_bytes: timing[1].as_u64().unwrap_or(0),
        }
    }

    /// Saves the viewport (`width` × `height`, nothing beyond it) as a PNG
    /// at `path`, whatever `CASCADE_CONSOLE_SCREENSHOTS` says: the docs'
    /// pictures, whose size the caller chooses.
    pub async fn screenshot_viewport(&mut self, path: &std::path::Path, width: u32, height: u32) {
        self.command(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let shot = self
            .command(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": false }),
            )
            .await;
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("a screenshot"))
            .expect("base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
