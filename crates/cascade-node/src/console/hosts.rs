//! Which host a request may name: no DNS rebinding.
//!
//! A page of another site can make the browser send requests to the
//! console under that site's own name, once its DNS answer turns into
//! this node's address (DNS rebinding). The browser then treats the
//! console as that site: it lets the page read the answers, and a POST's
//! `Origin` and `Host` both name the attacker's host, so the `Origin`
//! check of a delete (`delete.rs`) passes, and without `[auth]` the API
//! allows the anonymous call. What such a request cannot hide is its
//! `Host`: so every request, read or change, must name a host the console
//! is served as: its listen address (any address of the machine when it
//! listens on all of them), `localhost`, or a name of `[console]
//! allowed_hosts` (a proxy's). Ports are not compared: a proxy may serve
//! the console on another port, and a rebinding page cannot change the
//! name its requests carry.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cascade_core::limits::quote;

/// The hosts a request may name.
#[derive(Debug, Clone)]
pub(super) struct AllowedHosts {
    /// The console's listen address (None: not known, only names pass).
    listen: Option<IpAddr>,
    /// `localhost` and `[console] allowed_hosts`, lower-cased.
    names: Vec<String>,
}

impl AllowedHosts {
    pub(super) fn new(listen: Option<SocketAddr>, allowed: &[String]) -> Self {
        let mut names = vec!["localhost".to_owned()];
        names.extend(allowed.iter().map(|n| n.trim_end_matches('.').to_ascii_lowercase()));
        AllowedHosts {
            listen: listen.map(|a| a.ip()),
            names,
        }
    }

    /// Whether `host` (a `Host` header or an HTTP/2 authority, with or
    /// without its port) names this console; else why not.
    pub(super) fn check(&self, host: Option<&str>) -> Result<(), String> {
        let Some(host) = host.filter(|h| !h.is_empty()) else {
            return Err("refused: the request names no host (no Host header)".into());
        };
        let name = host_name(host);
        let allowed = match name.parse::<IpAddr>() {
            Ok(ip) => self.listen.is_some_and(|listen| {
                listen.is_unspecified() || listen == ip || (listen.is_loopback() && ip.is_loopback())
            }),
            Err(_) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                self.names.contains(&name)
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "refused: this console is not served as host {} (a page of another site may be \
                 pointing its name at this node: DNS rebinding). Open it by its address or localhost, \
                 or list the name under [console] allowed_hosts.",
                quote(host)
            ))
        }
    }
}

/// The name part of a `Host`: without its port, an IPv6 address without
/// its brackets.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Every request: its host checked before any route sees it; a foreign
/// one gets 421 Misdirected Request and says why, in plain text.
pub(super) async fn only_own_hosts(State(hosts): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match hosts.check(host) {
        Ok(()) => next.run(request).await,
        Err(why) => {
            let mut response = (StatusCode::MISDIRECTED_REQUEST, why).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listen: &str, allowed: &[&str]) -> AllowedHosts {
        let allowed: Vec<String> = allowed.iter().map(|s| (*s).to_owned()).collect();
        AllowedHosts::new(Some(listen.parse().unwrap()), &allowed)
    }

    #[test]
    fn the_listen_address_localhost_and_listed_names_are_served() {
        let on_loopback = hosts("127.0.0.1:8080", &["console.example.com"]);
        for own in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost:8080",
            "LOCALHOST",
            "console.example.com",
            "Console.Example.COM:443",
            "[::1]:8080",
        ] {
            assert_eq!(on_loopback.check(Some(own)), Ok(()), "{own}");
        }
        let on_all = hosts("0.0.0.0:8080", &[]);
        assert_eq!(on_all.check(Some("10.1.0.7:8080")), Ok(()));
    }

    #[test]
    fn a_rebound_name_or_another_address_is_refused_and_quoted_short() {
        let on_loopback = hosts("127.0.0.1:8080", &[]);
        for foreign in [
            "attacker.example:8080",
            "10.1.0.7:8080",
            "localhost.attacker.example",
            "",
        ] {
            let why = on_loopback.check(Some(foreign)).expect_err(foreign);
            assert!(why.starts_with("refused: "), "{why}");
        }
        assert!(on_loopback.check(None).is_err());
        let long = format!("{}.example", "a".repeat(5_000));
        assert!(on_loopback.check(Some(&long)).unwrap_err().len() < 600);
    }
}
