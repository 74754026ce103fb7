//! `[console]`: the web console a node serves beside its API (issue 30),
//! off unless `listen` is set.

use serde::Deserialize;

use super::ConfigError;

/// `[console]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Where the console is served (`http://ADDR/`, or `https://ADDR/` on
    /// a node with `[tls]`); none: not served.
    pub listen: Option<String>,
    /// Host names the console also answers to, besides its listen address
    /// and `localhost`: the names a proxy in front of it is reached by. A
    /// request naming any other host is refused (DNS rebinding).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// The most names `[console] allowed_hosts` may list.
pub const MAX_CONSOLE_ALLOWED_HOSTS: usize = 32;

/// The longest DNS name (RFC 1035).
const MAX_HOST_NAME_BYTES: usize = 253;

/// `[console] allowed_hosts`, checked: DNS names (letters, digits, `-`
/// and `.`; no port, no scheme), lower-cased, at most
/// [`MAX_CONSOLE_ALLOWED_HOSTS`].
pub(super) fn console_allowed_hosts(file: &ConsoleConfig) -> Result<Vec<String>, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        field: "console.allowed_hosts",
        message,
    };
    if file.allowed_hosts.len() > MAX_CONSOLE_ALLOWED_HOSTS {
        return Err(invalid(format!(
            "lists {} names, more than {MAX_CONSOLE_ALLOWED_HOSTS}",
            file.allowed_hosts.len()
        )));
    }
    file.allowed_hosts
        .iter()
        .map(|name| {
            let usable = !name.is_empty()
                && name.len() <= MAX_HOST_NAME_BYTES
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if usable {
                Ok(name.trim_end_matches('.').to_ascii_lowercase())
            } else {
                Err(invalid(format!(
                    "{} is not a host name (letters, digits, '-' and '.', at most {MAX_HOST_NAME_BYTES} bytes; \
                     no scheme or port, like console.example.com)",
                    cascade_core::limits::quote(name)
                )))
            }
        })
        .collect()
}

/// `[console] listen`, parsed: the address, or none when the console is off.
pub(super) fn console_listen(file: &ConsoleConfig) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    file.listen
        .as_deref()
        .map(|addr| {
            addr.parse().map_err(|e| ConfigError::Invalid {
                field: "console.listen",
                message: format!(
                    "{}: {e} (expected an address like 127.0.0.1:8080)",
                    cascade_core::limits::quote(addr)
                ),
            })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigFile, NodeSettings};

    #[test]
    fn the_console_is_off_unless_listen_is_set() {
        let file: ConfigFile = toml::from_str("region = \"eu-west\"\n[auth]\nmode = \"none\"\n").unwrap();
        assert_eq!(NodeSettings::from_file(&file).unwrap().console_listen, None);
        let file: ConfigFile =
            toml::from_str("region = \"eu-west\"\n[auth]\nmode = \"none\"\n[console]\nlisten = \"127.0.0.1:8080\"\n")
                .unwrap();
        assert_eq!(
            NodeSettings::from_file(&file).unwrap().console_listen,
            Some("127.0.0.1:8080".parse().unwrap())
        );
    }

    #[test]
    fn a_bad_console_address_names_the_key_and_quotes_a_prefix() {
        let e = console_listen(&ConsoleConfig {
            listen: Some("<b>".repeat(500)),
            allowed_hosts: Vec::new(),
        })
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("console.listen: "), "{e}");
        assert!(e.len() < 300, "{e}");
        let with_scheme = console_allowed_hosts(&ConsoleConfig {
            listen: None,
            allowed_hosts: vec!["https://console.example.com:443/".into()],
        })
        .unwrap_err()
        .to_string();
        assert!(with_scheme.starts_with("console.allowed_hosts: "), "{with_scheme}");
        let unknown = toml::from_str::<ConfigFile>("[console]\nport = 8080\n").unwrap_err();
        assert!(unknown.to_string().contains("port"), "{unknown}");
    }

    #[test]
    fn allowed_hosts_are_names_compared_without_case() {
        let file: ConfigFile = toml::from_str(
            "region = \"eu-west\"\n[auth]\nmode = \"none\"\n[console]\nlisten = \"127.0.0.1:8080\"\n\
             allowed_hosts = [\"Console.Example.com\", \"cascade.internal.\"]\n",
        )
        .unwrap();
        assert_eq!(
            NodeSettings::from_file(&file).unwrap().console_allowed_hosts,
            ["console.example.com", "cascade.internal"]
        );
        let many = ConsoleConfig {
            listen: None,
            allowed_hosts: vec!["a.example".into(); MAX_CONSOLE_ALLOWED_HOSTS + 1],
        };
        assert!(console_allowed_hosts(&many).is_err());
    }
}
