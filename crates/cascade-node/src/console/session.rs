//! Who the browser is: the bearer token its caller signed in with, kept
//! in an HttpOnly, SameSite=Strict cookie set by the sign-in form (or an
//! `Authorization: Bearer` header on the request itself, for scripts).
//!
//! The console never checks a token itself and never acts as anyone: it
//! sends the token, unchanged, on every API call it makes for the page
//! (`backend.rs`), and the node's authentication layer decides as it does
//! for the CLI. A token the node does not accept comes back UNAUTHENTICATED
//! and the page asks to sign in again. Without `[auth]` the node accepts
//! anonymous calls, and so do the pages.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

/// The cookie that holds the caller's token.
pub(super) const TOKEN_COOKIE: &str = "cascade_console_token";

/// The longest token accepted: a JWT with a few claims is well under it,
/// and a cookie of more than 4 KB is dropped by browsers.
pub(crate) const MAX_TOKEN_BYTES: usize = 3_500;

/// The browser's caller, as its request says: a token, or none.
#[derive(Debug, Clone, Default)]
pub(super) struct Caller {
    pub token: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let from_header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let token = from_header
            .map(str::to_owned)
            .or_else(|| cookie(parts, TOKEN_COOKIE))
            .filter(|t| usable_token(t).is_ok());
        Ok(Caller { token })
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

/// A token the console can carry: printable ASCII a cookie may hold
/// (RFC 6265's cookie-octets) and an HTTP header too, of a bounded size.
pub(super) fn usable_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!(
            "the token is {} bytes, more than {MAX_TOKEN_BYTES}",
            token.len()
        ));
    }
    let cookie_octet = |b: u8| {
        b == 0x21
            || (0x23..=0x2b).contains(&b)
            || (0x2d..=0x3a).contains(&b)
            || (0x3c..=0x5b).contains(&b)
            || (0x5d..=0x7e).contains(&b)
    };
    if !token.bytes().all(cookie_octet) {
        return Err("a token is printable ASCII without spaces, quotes, commas, semicolons or backslashes".into());
    }
    Ok(())
}

/// Only a path of this console: never another site (no open redirect).
pub(super) fn local_path(next: &str) -> &str {
    let ok = next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') && next.len() <= 2048;
    if ok {
        next
    } else {
        "/operations"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_token_is_what_a_cookie_and_a_header_can_carry() {
        assert!(usable_token("c4sc4de-T0ken_.~+/=").is_ok());
        assert!(usable_token("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln").is_ok());
        for bad in ["", "a b", "a;b", "a,b", "a\"b", "a\\b", "a\nb", "é"] {
            assert!(usable_token(bad).is_err(), "{bad:?}");
        }
        assert!(usable_token(&"a".repeat(MAX_TOKEN_BYTES + 1)).is_err());
    }

    #[test]
    fn sign_in_goes_back_only_to_a_page_of_the_console() {
        assert_eq!(local_path("/operations/x"), "/operations/x");
        for elsewhere in ["https://evil.example/", "//evil.example/", "/\\evil", "operations"] {
            assert_eq!(local_path(elsewhere), "/operations", "{elsewhere}");
        }
    }

    #[test]
    fn the_token_comes_from_the_header_else_the_cookie() {
        let request = axum::http::Request::builder()
            .header(header::COOKIE, "other=1; cascade_console_token=from-cookie")
            .body(())
            .unwrap();
        let (mut parts, ()) = request.into_parts();
        let caller = futures::executor::block_on(Caller::from_request_parts(&mut parts, &())).unwrap();
        assert_eq!(caller.token.as_deref(), Some("from-cookie"));
        parts
            .headers
            .insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer from-header"));
        let caller = futures::executor::block_on(Caller::from_request_parts(&mut parts, &())).unwrap();
        assert_eq!(caller.token.as_deref(), Some("from-header"));
    }
}
