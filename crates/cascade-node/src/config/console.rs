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
        })
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("console.listen: "), "{e}");
        assert!(e.len() < 300, "{e}");
        let unknown = toml::from_str::<ConfigFile>("[console]\nport = 8080\n").unwrap_err();
        assert!(unknown.to_string().contains("port"), "{unknown}");
    }
}
