//! Reading the deployment manifests for `tests/deploy.rs`: YAML and
//! TOML accessors that name what is missing, a database URL, compose
//! services as compose merges them, and labels and selectors as kustomize
//! renders them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a YAML file.
pub fn yaml(path: &Path) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
}

pub fn yaml_one(path: &Path) -> Yaml {
    let mut docs = yaml(path);
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

pub fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str().unwrap_or_else(|| panic!("{what}: not a string: {y:?}"))
}

pub fn list<'a>(y: &'a Yaml, what: &str) -> &'a [Yaml] {
    y.as_vec()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("{what}: not a list: {y:?}"))
}

pub fn strings(y: &Yaml, what: &str) -> Vec<String> {
    list(y, what).iter().map(|s| str_of(s, what).to_owned()).collect()
}

/// A YAML mapping of strings to strings (labels, selectors, environment).
pub fn string_map(y: &Yaml, what: &str) -> BTreeMap<String, String> {
    y.as_hash()
        .unwrap_or_else(|| panic!("{what}: not a mapping: {y:?}"))
        .iter()
        .map(|(k, v)| (str_of(k, what).to_owned(), str_of(v, what).to_owned()))
        .collect()
}

/// The element of `items` whose `name` is `name`.
pub fn named<'a>(items: &'a Yaml, name: &str, what: &str) -> &'a Yaml {
    list(items, what)
        .iter()
        .find(|i| i["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("{what}: no entry named {name}"))
}

/// A node configuration as TOML, for what this test compares; whether
/// the node accepts it is `every_deployed_node_config_is_one_the_node_reads`.
pub fn toml_table(path: &Path) -> toml::Table {
    read(path)
        .parse()
        .unwrap_or_else(|e| panic!("{}: not TOML: {e}", path.display()))
}

pub fn toml_str<'a>(table: &'a toml::Table, key: &str, what: &str) -> &'a str {
    table
        .get(key)
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| panic!("{what}: {key} is not a string"))
}

pub fn toml_section<'a>(table: &'a toml::Table, key: &str, what: &str) -> &'a toml::Table {
    table
        .get(key)
        .and_then(toml::Value::as_table)
        .unwrap_or_else(|| panic!("{what}: no [{key}]"))
}

pub fn port_of(addr: &str, what: &str) -> u16 {
    addr.parse::<SocketAddr>()
        .unwrap_or_else(|e| panic!("{what} {addr:?}: {e}"))
        .port()
}

/// `postgres://USER@HOST:PORT/DATABASE`, as the deployed configs write it.
#[derive(Debug)]
pub struct DatabaseUrl {
    pub user: String,
    pub host: String,
    pub port: u16,
    pub database: String,
}

pub fn database_url(url: &str, what: &str) -> DatabaseUrl {
    let rest = url
        .strip_prefix("postgres://")
        .unwrap_or_else(|| panic!("{what}: url {url:?} is not postgres://"));
    let (user, rest) = rest
        .split_once('@')
        .unwrap_or_else(|| panic!("{what}: url {url:?} names no user"));
    assert!(
        !user.contains(':'),
        "{what}: url {url:?} holds a password (it comes from a file or the environment)"
    );
    let (host_port, database) = rest
        .split_once('/')
        .unwrap_or_else(|| panic!("{what}: url {url:?} names no database"));
    let (host, port) = host_port
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{what}: url {url:?} names no port"));
    DatabaseUrl {
        user: user.to_owned(),
        host: host.to_owned(),
        port: port.parse().unwrap_or_else(|e| panic!("{what}: url {url:?}: {e}")),
        database: database.to_owned(),
    }
}

/// The labels kustomize gives the objects of one overlay (the base's and
/// the overlay's `labels`), each of which must reach the selectors.
pub fn kustomize_labels(kustomization: &Yaml, what: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for entry in list(&kustomization["labels"], what) {
        assert_eq!(
            entry["includeSelectors"].as_bool(),
            Some(true),
            "{what}: labels reach the selectors"
        );
        labels.extend(string_map(&entry["pairs"], what));
    }
    labels
}

/// `selector` as kustomize renders it with `labels` added.
pub fn with_labels(selector: &Yaml, labels: &BTreeMap<String, String>, what: &str) -> BTreeMap<String, String> {
    let mut rendered = string_map(selector, what);
    rendered.extend(labels.clone());
    rendered
}

/// The environment variable `name` of a container, and its position.
pub fn env_var<'a>(container: &'a Yaml, name: &str) -> (usize, &'a Yaml) {
    list(&container["env"], "env")
        .iter()
        .enumerate()
        .find(|(_, v)| v["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("env: no {name}"))
}

/// A volume entry `SOURCE:TARGET[:ro]` of a compose service.
pub fn compose_volumes(service: &Yaml, what: &str) -> Vec<(String, String)> {
    strings(&service["volumes"], what)
        .iter()
        .map(|v| {
            let v = v.trim_end_matches(":ro");
            let (source, target) = v.split_once(':').unwrap_or_else(|| panic!("{what}: volume {v:?}"));
            (source.to_owned(), target.to_owned())
        })
        .collect()
}

/// Where `source` is mounted in a compose service.
pub fn mounted_at(volumes: &[(String, String)], source: &str, what: &str) -> String {
    volumes
        .iter()
        .find(|(s, _)| s == source)
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| panic!("{what}: no volume from {source}: {volumes:?}"))
}

/// The volume holding `path` in a compose service, and the path in it.
pub fn volume_holding(volumes: &[(String, String)], path: &str, what: &str) -> (String, String) {
    volumes
        .iter()
        .find_map(|(source, target)| {
            path.strip_prefix(&format!("{target}/"))
                .map(|rest| (source.clone(), rest.to_owned()))
        })
        .unwrap_or_else(|| panic!("{what}: {path} is on no volume: {volumes:?}"))
}

/// A compose service with the mapping it merges (`<<: *node`) under its
/// own keys, as compose reads it (YAML 1.2 loaders keep `<<` as a key).
pub fn merged(service: &Yaml) -> Yaml {
    let own = service.as_hash().expect("a service is a mapping");
    let mut out = match own.get(&Yaml::String("<<".into())) {
        Some(Yaml::Hash(base)) => base.clone(),
        _ => Default::default(),
    };
    for (k, v) in own {
        if k.as_str() != Some("<<") {
            out.insert(k.clone(), v.clone());
        }
    }
    Yaml::Hash(out)
}
