//! An action's body: JSON only, and small.

use super::http::Refused;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Bytes};
use hyper::header::CONTENT_TYPE;
use hyper::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

/// An action's JSON body is a field or two: anything larger is refused.
const BODY_LIMIT: usize = 4096;

/// The body as JSON, refused unless it says it is JSON: an HTML form can
/// send only form and text types, so a page elsewhere cannot post one
/// (and `fetch` with this type from elsewhere needs a CORS preflight,
/// which the console never grants).
pub(super) async fn read_json<T, B>(headers: &HeaderMap, body: B) -> Result<T, Refused>
where
    T: DeserializeOwned + Default,
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let invalid = |status, message: String| Refused {
        status,
        code: "InvalidArgument",
        message,
    };
    if !is_json(headers) {
        let message = "an action's body must be JSON (Content-Type: application/json)";
        return Err(invalid(StatusCode::UNSUPPORTED_MEDIA_TYPE, message.into()));
    }
    let bytes = match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            let message = format!("the body could not be read or is over {BODY_LIMIT} bytes");
            return Err(invalid(StatusCode::BAD_REQUEST, message));
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        let message = format!("the body is not an action's JSON: {e}");
        invalid(StatusCode::BAD_REQUEST, message)
    })
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn only_json_bodies_are_read() {
        let mut headers = HeaderMap::new();
        assert!(!is_json(&headers));
        for (value, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/x-www-form-urlencoded", false),
            ("text/plain", false),
            ("multipart/form-data; boundary=x", false),
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_json(&headers), json, "{value}");
        }
    }
}
