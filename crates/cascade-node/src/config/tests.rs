use super::*;
use cascade_tls::DevPki;

/// A config file's settings; `[auth] mode = "none"` added when the text
/// has no `[auth]` (mandatory in files), so each test says only its part.
fn settings(text: &str) -> Result<NodeSettings, ConfigError> {
    let text = if text.contains("[auth]") {
        text.to_owned()
    } else {
        format!("{text}\n[auth]\nmode = \"none\"\n")
    };
    NodeSettings::from_file(&ConfigFile::parse(&text, Path::new("node.toml"))?)
}

fn err(text: &str) -> String {
    match settings(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn limits_come_from_the_file() {
    let s = settings(
        "region = \"eu-1\"\n[limits]\nmax_message_bytes = 65536\nmax_batch = 5\nmax_page_size = 7\ndefault_page_size = 3\n",
    )
    .unwrap();
    assert_eq!(
        (
            s.limits.max_message_bytes,
            s.limits.max_batch_create,
            s.limits.max_page_size,
            s.limits.default_page_size
        ),
        (65536, 5, 7, 3)
    );
    let defaults = settings("region = \"eu-1\"").unwrap().limits;
    assert_eq!(defaults.max_message_bytes, cascade_proto::MAX_MESSAGE_BYTES);
}

#[test]
fn limits_that_cannot_work_are_refused_by_name() {
    assert_eq!(
        err("region = \"eu-1\"\n[limits]\nmax_batch = 0"),
        "limits.max_batch: must be at least 1"
    );
    assert!(err("region = \"eu-1\"\n[limits]\nmax_message_bytes = 100").starts_with("limits.max_message_bytes"));
    assert_eq!(
        err("region = \"eu-1\"\n[limits]\nmax_page_size = 10\ndefault_page_size = 20"),
        "limits.default_page_size: 20 exceeds max_page_size 10"
    );
    assert!(err("region = \"eu-1\"\n[limits]\nmax_pages = 10").contains("unknown field"));
}

#[test]
fn confirm_above_is_off_by_default_and_checked_at_load() {
    assert_eq!(settings("region = \"eu-1\"").unwrap().limits.confirm_above, None);
    let set = settings("region = \"eu-1\"\n[limits]\nconfirm_above = 500").unwrap();
    assert_eq!(set.limits.confirm_above, Some(500));
    for refused in ["0", "10001"] {
        let e = err(&format!("region = \"eu-1\"\n[limits]\nconfirm_above = {refused}"));
        assert!(e.starts_with("limits.confirm_above: must be 1 to 10000"), "{e}");
    }
}

#[test]
fn a_peer_region_is_one_address_or_a_list_of_one_to_sixteen() {
    let peers = |entry: &str| settings(&format!("region = \"eu-1\"\n[peers]\nus-2 = {entry}\n"));
    let us2 = RegionId::parse("us-2").unwrap();
    let addresses = |entry: &str| peers(entry).unwrap().peers[&us2].as_slice().to_vec();
    assert_eq!(addresses("\"http://a:1\""), ["http://a:1"]);
    assert_eq!(
        addresses("[\"http://a:1\", \"http://b:2\"]"),
        ["http://a:1", "http://b:2"]
    );
    assert_eq!(
        peers("[\"http://a:1\", \"http://b:2\"]").unwrap().peers[&us2].to_string(),
        "http://a:1, http://b:2"
    );
    assert_eq!(
        err("region = \"eu-1\"\n[peers]\nus-2 = []\n"),
        "peers: us-2: a region needs at least one address"
    );
    let seventeen: Vec<String> = (0..17).map(|i| format!("\"http://n{i}:1\"")).collect();
    assert_eq!(
        err(&format!(
            "region = \"eu-1\"\n[peers]\nus-2 = [{}]\n",
            seventeen.join(", ")
        )),
        "peers: us-2: at most 16 addresses per region, not 17"
    );
    assert!(
        err("region = \"eu-1\"\n[peers]\nus-2 = [\"http://a:1\", \"https://b:2\"]\n")
            .contains("\"https://b:2\" must start with http://")
    );
    assert_eq!(
        settings("region = \"eu-1\"").unwrap().protocol_version,
        cascade_proto::PROTOCOL_VERSION
    );
}

#[test]
fn admin_access_comes_from_the_file_and_defaults_to_nobody() {
    assert_eq!(settings("region = \"eu-1\"").unwrap().admin, AdminAccess::default());
    let s = settings("region = \"eu-1\"\n[admin]\ntoken = \"0123456789abcdef\"\n").unwrap();
    assert_eq!(s.admin.token.as_deref(), Some("0123456789abcdef"));
    assert_eq!(
        err("region = \"eu-1\"\n[admin]\ntoken = \"short\"\n"),
        "admin.token: must be at least 16 bytes, without spaces"
    );
    assert!(err("region = \"eu-1\"\n[admin]\nidentities = [\"alice\"]\n").starts_with("admin.identities: "));
    assert!(err("region = \"eu-1\"\n[admin]\ntokens = [\"x\"]\n").contains("unknown field `tokens`"));
}

#[test]
fn the_storage_engine_comes_from_the_file_and_defaults_to_sled() {
    assert_eq!(settings("region = \"eu-1\"").unwrap().engine, StorageEngine::Sled);
    assert_eq!(
        settings("region = \"eu-1\"\n[storage]\n").unwrap().engine,
        StorageEngine::Sled
    );
    for engine in StorageEngine::ALL.into_iter().filter(|e| e.embedded()) {
        let text = format!("region = \"eu-1\"\ndata_dir = \"d\"\n[storage]\nengine = \"{engine}\"\n");
        assert_eq!(settings(&text).unwrap().engine, engine);
    }
    assert_eq!(
        err("region = \"eu-1\"\n[storage]\nengine = \"rocksdb\""),
        "storage.engine: unknown storage engine \"rocksdb\" (expected one of: sled, fjall, postgres)"
    );
    assert!(err("region = \"eu-1\"\n[storage]\nengine = \"FJALL\"").starts_with("storage.engine: "));
    assert!(err("region = \"eu-1\"\n[storage]\nengine = 1").contains("invalid type"));
    let cache = |text: &str| settings(&format!("region = \"eu-1\"\n[storage]\n{text}"));
    assert_eq!(cache("").unwrap().cache_bytes, crate::store::DEFAULT_CACHE_BYTES);
    assert_eq!(cache("cache_mb = 256").unwrap().cache_bytes, 256 << 20);
    assert_eq!(
        err("region = \"eu-1\"\n[storage]\ncache_mb = 1"),
        "storage.cache_mb: 1 is outside 4..=1048576"
    );
    assert!(err("region = \"eu-1\"\n[storage]\nengin = \"fjall\"").contains("unknown field `engin`"));
}

#[test]
fn the_cluster_name_defaults_to_cascade_and_is_checked() {
    assert_eq!(settings("region = \"eu-1\"").unwrap().cluster, "cascade");
    assert_eq!(
        settings("region = \"eu-1\"\ncluster = \"prod-2\"").unwrap().cluster,
        "prod-2"
    );
    assert_eq!(
        err("region = \"eu-1\"\ncluster = \"Prod 2\""),
        "cluster: \"Prod 2\" is no cluster name: 1 to 63 lower-case letters, digits and -"
    );
}

fn tls_section(dir: &Path, region: &str) -> String {
    format!(
        "[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
        dir.join("ca.pem"),
        dir.join(format!("{region}.pem")),
        dir.join(format!("{region}.key"))
    )
}

#[test]
fn tls_needs_the_certificate_of_this_region_and_https_peers() {
    let dir = tempfile::tempdir().unwrap();
    DevPki::generate(&["eu-1", "us-2"]).unwrap().write(dir.path()).unwrap();
    let ok = format!(
        "region = \"eu-1\"\n[peers]\nus-2 = \"https://127.0.0.1:1\"\n{}",
        tls_section(dir.path(), "eu-1")
    );
    let s = settings(&ok).unwrap();
    assert_eq!(s.tls.as_ref().map(|t| t.region().as_str()), Some("eu-1"));

    let wrong_cert = format!("region = \"eu-1\"\n{}", tls_section(dir.path(), "us-2"));
    let e = err(&wrong_cert);
    assert!(
        e.starts_with("tls.cert: ") && e.contains("names region us-2, but this node is region eu-1"),
        "{e}"
    );

    let http_peer = format!(
        "region = \"eu-1\"\n[peers]\nus-2 = \"http://127.0.0.1:1\"\n{}",
        tls_section(dir.path(), "eu-1")
    );
    assert!(err(&http_peer).contains("must start with https:// ([tls] is on)"));
    let https_without_tls = "region = \"eu-1\"\n[peers]\nus-2 = \"https://127.0.0.1:1\"\n";
    assert!(err(https_without_tls).contains("https:// peers need it"));

    let missing = format!("region = \"eu-1\"\n{}", tls_section(&dir.path().join("nope"), "eu-1"));
    assert!(err(&missing).contains("cannot read"), "{}", err(&missing));
}

#[test]
fn a_config_file_without_auth_is_refused_naming_both_choices() {
    let file = ConfigFile::parse("region = \"eu-1\"\n", Path::new("node.toml")).unwrap();
    let refusal = match NodeSettings::from_file(&file) {
        Ok(_) => panic!("a file without [auth] was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        refusal.starts_with("auth: is required") && refusal.contains("\"required\"") && refusal.contains("\"none\""),
        "{refusal}"
    );
    let off = settings("region = \"eu-1\"\n[auth]\nmode = \"none\"\n").unwrap();
    assert_eq!(off.auth.mode, crate::auth::AuthMode::Off);
    assert!(err("region = \"eu-1\"\n[auth]\n").starts_with("auth.mode: is required"));
    assert!(err("region = \"eu-1\"\n[auth]\nmode = \"maybe\"\n").contains("\"maybe\" is no mode"));
}

#[test]
fn required_authentication_refuses_the_admin_token_and_needs_a_means_and_a_policy() {
    let required =
        "region = \"eu-1\"\n[auth]\nmode = \"required\"\ntokens_file = \"t.toml\"\npolicy_file = \"p.cedar\"\n";
    let s = settings(required).unwrap();
    assert_eq!(s.auth.mode, crate::auth::AuthMode::Required);
    let with_token = format!("{required}[admin]\ntoken = \"0123456789abcdef0123\"\n");
    let refusal = err(&with_token);
    assert!(
        refusal.starts_with("admin: ") && refusal.contains("tokens_file"),
        "{refusal}"
    );
    assert!(
        err("region = \"eu-1\"\n[auth]\nmode = \"required\"\npolicy_file = \"p.cedar\"\n").contains("needs a means")
    );
    assert!(
        err("region = \"eu-1\"\n[auth]\nmode = \"required\"\ntokens_file = \"t.toml\"\n")
            .starts_with("auth.policy_file")
    );
}

#[test]
fn client_ca_needs_tls_client_certificates_and_a_readable_ca() {
    let dir = tempfile::tempdir().unwrap();
    DevPki::generate(&["eu-1"]).unwrap().write(dir.path()).unwrap();
    let clients = dir.path().join("clients");
    DevPki::generate(&[]).unwrap().write(&clients).unwrap();
    let auth = |client_ca: &Path, certificates: bool| {
        format!(
            "[auth]\nmode = \"none\"\nclient_certificates = {certificates}\nclient_ca = {:?}\n",
            client_ca
        )
    };
    let tls = tls_section(dir.path(), "eu-1");
    let ok = format!("region = \"eu-1\"\n{}{tls}", auth(&clients.join("ca.pem"), true));
    assert_eq!(settings(&ok).unwrap().auth.client_ca, Some(clients.join("ca.pem")));
    let e = err(&format!("region = \"eu-1\"\n{}", auth(&clients.join("ca.pem"), true)));
    assert_eq!(e, "auth.client_ca: needs [tls]");
    let e = err(&format!(
        "region = \"eu-1\"\n{}{tls}",
        auth(&clients.join("ca.pem"), false)
    ));
    assert!(e.starts_with("auth.client_ca: needs client_certificates = true"), "{e}");
    let e = err(&format!(
        "region = \"eu-1\"\n{}{tls}",
        auth(&clients.join("ca.key"), true)
    ));
    assert!(e.starts_with("auth.client_ca: ") && e.contains("ca.key"), "{e}");
}

#[test]
fn max_retention_defaults_to_30_days_and_reads_a_duration() {
    let s = settings("region = \"eu-1\"\n").unwrap();
    assert_eq!(s.policy.max_retention_ms, 30 * 86_400_000);
    let s = settings("region = \"eu-1\"\n[limits]\nmax_retention = \"7d\"\n").unwrap();
    assert_eq!(s.policy.max_retention_ms, 7 * 86_400_000);
    assert!(
        err("region = \"eu-1\"\n[limits]\nmax_retention = \"7 years\"\n").starts_with("limits.max_retention: "),
        "an unreadable duration names the field"
    );
}

#[test]
fn a_kind_retained_longer_than_max_retention_is_refused_at_load() {
    let schema =
        cascade_core::Schema::from_toml("[kinds.project]\nretain = \"40d\"\n[kinds.network]\nretain = \"1d\"\n")
            .unwrap();
    let limits = super::LimitsConfig::default();
    let e = super::max_retention(&limits, &schema).unwrap_err().to_string();
    assert_eq!(
        e,
        "schema: kinds.project.retain: 40d is longer than [limits] max_retention (30d)"
    );
    let limits = super::LimitsConfig {
        max_retention: Some("60d".into()),
        ..Default::default()
    };
    assert_eq!(super::max_retention(&limits, &schema).unwrap(), 60 * 86_400_000);
}
