//! A headless Chromium for tests, driven over the DevTools protocol
//! (JSON over a websocket: the few frames the protocol needs are written
//! here rather than pulled in as a dependency). Blocking calls, each
//! bounded by a read timeout. Killed (by the pid we started) on drop.

use crate::TempDir;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether Chromium is installed (`scripts/install-deps.sh` installs it).
pub fn available() -> bool {
    Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Where the console tests' screenshots go: `target/console-screenshots`,
/// next to the test binaries' profile directory.
pub fn screenshots() -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    // target/<profile>/deps/<test>
    let target = exe.ancestors().nth(3).expect("the target directory");
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

/// Polls `expression` in the page until `done` accepts its value; panics
/// with the last value after `deadline`. Every value seen goes to `seen`.
pub async fn until(
    browser: &mut Browser,
    expression: &str,
    deadline: Duration,
    seen: &mut Vec<serde_json::Value>,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + deadline;
    loop {
        let value = browser.eval(expression);
        if seen.last() != Some(&value) {
            seen.push(value.clone());
        }
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < end,
            "{expression}: still {value} (seen {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct Browser {
    child: Child,
    page: TcpStream,
    next_id: u64,
    _profile: TempDir,
}

impl Browser {
    /// Starts Chromium headless on a blank page and connects to the page.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// As [`Self::start`], with more Chromium flags (for example
    /// `--host-resolver-rules`).
    pub fn start_with(extra: &[&str]) -> Self {
        let profile = TempDir::new("chromium");
        let mut child = Command::new("chromium")
            .args(extra)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .args([
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .args(["--window-size=1280,900", "--hide-scrollbars"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let port = stderr
            .by_ref()
            .take(200)
            .map_while(Result::ok)
            .find_map(|line| {
                let rest = line.split("ws://127.0.0.1:").nth(1)?;
                rest.split('/').next()?.parse::<u16>().ok()
            })
            .expect("chromium printed its DevTools port");
        // Drained, or Chromium blocks once the pipe is full.
        std::thread::spawn(move || stderr.for_each(drop));
        let url = page_target(port);
        let page = connect(&url);
        Self {
            child,
            page,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Calls a DevTools method and returns its result.
    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = serde_json::json!({ "id": id, "method": method, "params": params });
        send_text(&mut self.page, &message.to_string());
        // Events arrive in between: skip them (bounded, with a deadline).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "{method}: no answer");
            let text = read_text(&mut self.page);
            let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    pub fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({ "url": url }));
    }

    /// The value of a JavaScript expression in the page.
    pub fn eval(&mut self, expression: &str) -> serde_json::Value {
        let params = serde_json::json!({
            "expression": expression, "returnByValue": true, "awaitPromise": true
        });
        let result = self.call("Runtime.evaluate", params);
        result["result"]["value"].clone()
    }

    /// A PNG of the page as it is.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let params = serde_json::json!({ "format": "png" });
        let result = self.call("Page.captureScreenshot", params);
        base64_decode(result["data"].as_str().expect("image data"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The websocket URL of the page Chromium opened, once it lists it.
fn page_target(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let targets = get_json(port, "/json/list");
        let page = targets
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str());
        if let Some(url) = page {
            return url.to_string();
        }
        assert!(Instant::now() < deadline, "no page target: {targets}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A GET of Chromium's DevTools HTTP endpoint (HTTP/1.1, which it
/// answers with a Content-Length and keeps the connection open).
fn get_json(port: u16, path: &str) -> serde_json::Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .expect("send");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        assert!(head.len() < 8192, "answer head too long");
        head.push(read_u8(&mut stream));
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|l| l.trim().parse().ok())
        .expect("a Content-Length");
    let mut body = vec![0; length];
    stream.read_exact(&mut body).expect("body");
    serde_json::from_slice(&body).expect("JSON")
}

/// Opens the websocket at `url` (`ws://host:port/path`).
fn connect(url: &str) -> TcpStream {
    let rest = url.strip_prefix("ws://").expect("a ws:// URL");
    let (address, path) = rest.split_once('/').expect("a path");
    let mut stream = TcpStream::connect(address).expect("connect");
    let timeout = Some(Duration::from_secs(30));
    stream.set_read_timeout(timeout).expect("read timeout");
    let request = format!(
        "GET /{path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).expect("handshake");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        assert!(head.len() < 4096, "handshake answer too long");
        head.push(read_u8(&mut stream));
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

/// One masked text frame (clients must mask; the mask may be anything).
fn send_text(stream: &mut TcpStream, text: &str) {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81];
    let len = text.len();
    if len < 126 {
        frame.push(0x80 | len as u8);
    } else if len <= u16::MAX as usize {
        frame.push(0x80 | 126);
        frame.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        frame.push(0x80 | 127);
        frame.extend_from_slice(&(len as u64).to_be_bytes());
    }
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    stream.write_all(&frame).expect("send a frame");
}

/// The next text message (continuation frames joined, others skipped).
fn read_text(stream: &mut TcpStream) -> String {
    let mut message = Vec::new();
    loop {
        let first = read_u8(stream);
        let len = match read_u8(stream) & 0x7f {
            126 => u16::from_be_bytes(read_array(stream)) as usize,
            127 => u64::from_be_bytes(read_array(stream)) as usize,
            n => n as usize,
        };
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).expect("payload");
        let opcode = first & 0x0f;
        if opcode == 0x1 || opcode == 0x0 {
            message.extend_from_slice(&payload);
            if first & 0x80 != 0 {
                return String::from_utf8(message).expect("UTF-8 text");
            }
        }
    }
}

fn read_u8(stream: &mut TcpStream) -> u8 {
    read_array::<1>(stream)[0]
}

fn read_array<const N: usize>(stream: &mut TcpStream) -> [u8; N] {
    let mut bytes = [0; N];
    stream.read_exact(&mut bytes).expect("a frame");
    bytes
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0);
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = ALPHABET.iter().position(|a| *a == byte).expect("base64") as u32;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
