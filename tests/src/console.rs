//! What the console's browser tests share (and a token file, which the
//! security and audit tests use too): a plain HTTP request to the admin
//! port, and signing in through the page.

use crate::browser::{until, Browser};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A token file with `tokens` (name, role, token), digests only, written
/// into `dir`; its path.
pub fn token_file(dir: &Path, tokens: &[(&str, &str, &str)]) -> PathBuf {
    let mut file = String::new();
    for (name, role, token) in tokens {
        let digest: String = drover_server::auth::hash_token(token)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        file.push_str(&format!(
            "[[token]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{digest}\"\n"
        ));
    }
    let path = dir.join("tokens.toml");
    std::fs::write(&path, file).expect("token file");
    path
}

/// A plain HTTP/1.0 request with a bearer token to the admin port at
/// `base` (`http://host:port`): the status and the body.
pub fn http(
    base: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<(&str, &str)>,
) -> (u16, String) {
    use std::io::{Read, Write};
    let address = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the admin port");
    let mut request =
        format!("{method} {path} HTTP/1.0\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n");
    if let Some((content_type, body)) = body {
        request.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        request.push_str("\r\n");
    }
    stream.write_all(request.as_bytes()).expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    (status.unwrap_or(0), body.to_string())
}

/// Signs `token` in through the page's form (shown once the page finds
/// no token, or after signing out), waiting up to `wait` for the form.
pub async fn sign_in(browser: &mut Browser, token: &str, wait: Duration) {
    let mut seen = Vec::new();
    let login = "!document.getElementById('login').hidden";
    until(browser, login, wait, &mut seen, |v| v == true).await;
    browser.eval(&format!(
        "document.getElementById('token').value = '{token}'; \
         document.getElementById('login').requestSubmit(); true"
    ));
}
