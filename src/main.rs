//! `cascade`: the node (`cascade serve`), the local demo (`cascade demo`)
//! and the client commands, in one binary.

// The command-line front end: writing to stdout and stderr is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod demo;

/// glibc's malloc was about a third of the writer's CPU in a 1M cascade
/// (`perf record`, docs/BENCHMARKS.md); mimalloc is the process-wide allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use cascade_client::cli::{ClientArgs, Command as ClientCommand};
use cascade_node::auth::AuthMode;
use cascade_node::store::{open_postgres, PostgresSettings, StorageEngine};
use cascade_node::{serve_region_node as serve_region_node_on, ConfigFile, Node, NodeSettings, SharedStore};
use cascade_tls::DevPki;
use clap::{CommandFactory, Parser, Subcommand};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "cascade",
    version,
    about = "Multi-region resource store with safe cascading deletion",
    after_help = "Exit status: 0 success; 1 an error, a failed operation (delete --wait), a stuck \
                  deletion (explain), a violation (check), an unreachable region (status, list \
                  --all-regions), a node \
                  not SERVING (health); 2 a command line that does not parse; 3 delete --cascade \
                  would leave members held (nothing changed; --allow-blocked starts it); 4 delete \
                  --wait stopped on a stuck deletion (its explanation is printed); 5 delete \
                  --cascade larger than --confirm-above not confirmed (nothing changed; --yes \
                  confirms it).\n\
                  Times show in the local zone (TZ), or UTC with --utc; -o json is the stable \
                  contract for scripts (docs/json-output.md)."
)]
struct Cli {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a region node.
    Serve(ServeArgs),
    /// Start three local region nodes with example data and show what to try.
    Demo(demo::DemoArgs),
    /// Generate a development CA and a certificate per region (mutual TLS).
    ///
    /// Writes ca.pem, ca.key and REGION.pem, REGION.key into --out. An
    /// existing ca.pem/ca.key there is reused, so a region can be added
    /// later; existing region certificates are kept unless --force.
    DevCerts(DevCertsArgs),
    /// Print a shell completion script for `cascade`.
    ///
    /// bash: `cascade completions bash > ~/.local/share/bash-completion/completions/cascade`;
    /// zsh: `cascade completions zsh > "${fpath[1]}/_cascade"`;
    /// fish: `cascade completions fish > ~/.config/fish/completions/cascade.fish`.
    Completions {
        /// bash, zsh, fish (also elvish, powershell).
        shell: clap_complete::Shell,
    },
    #[command(flatten)]
    Client(ClientCommand),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The node's TOML configuration; flags and environment override it.
    #[arg(long, env = "CASCADE_CONFIG")]
    config: Option<PathBuf>,
    /// Region id this node owns.
    #[arg(long, env = "CASCADE_REGION")]
    region: Option<String>,
    /// Address to listen on (port 0 picks a free one; the bound address is printed).
    #[arg(long, env = "CASCADE_LISTEN")]
    listen: Option<String>,
    /// Directory of the database.
    #[arg(long, env = "CASCADE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Storage engine of the data directory: sled (the default) or fjall.
    /// A data directory keeps the engine that created it.
    #[arg(long, env = "CASCADE_STORAGE_ENGINE", value_name = "ENGINE")]
    storage_engine: Option<StorageEngine>,
    /// Schema file (default: the embedded example schema).
    #[arg(long, env = "CASCADE_SCHEMA")]
    schema: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (`GET /metrics`); off
    /// unless given here or as `metrics_listen` in the config.
    #[arg(long, env = "CASCADE_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Serve the web console on this address (README, "The console"); off
    /// unless given here or as `[console] listen` in the config. HTTPS when
    /// the node has `[tls]`.
    #[arg(long, env = "CASCADE_CONSOLE_LISTEN", value_name = "ADDR")]
    console_listen: Option<String>,
    /// Export spans to this OTLP/gRPC collector (`http://HOST:4317`); off
    /// unless given here or as `[tracing] otlp_endpoint` in the config.
    #[arg(long, env = "CASCADE_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// This node's name among its region's nodes, when they share a
    /// PostgreSQL database (`[ha] node_name`; default: its advertised
    /// address).
    #[arg(long, env = "CASCADE_NODE_NAME", value_name = "NAME")]
    node_name: Option<String>,
    /// Where the region's other nodes and its clients reach this node
    /// (`[ha] advertise`), e.g. `http://10.0.0.7:50051`; required when it
    /// listens on a wildcard address and shares a PostgreSQL database.
    #[arg(long, env = "CASCADE_ADVERTISE", value_name = "URL")]
    advertise: Option<String>,
    /// `[auth] mode`: `none` runs without authentication (anyone who can
    /// reach the node may create and delete anything), for a node started
    /// without a config file or one whose file has no `[auth]`; a config
    /// file's `[auth]` is where `required` and its means are set.
    #[arg(long = "auth", env = "CASCADE_AUTH", value_name = "MODE")]
    auth_mode: Option<String>,
    /// Start even when the schema file changes the schema this region
    /// stored in a way its stored data forbids (a kind removed that still
    /// has resources, ...): without it such a start is refused with the
    /// reason and the count. For this start only; written to the audit log.
    #[arg(long)]
    accept_schema_unchecked: bool,
}

#[derive(Debug, clap::Args)]
struct DevCertsArgs {
    /// Directory to write into (created if missing).
    #[arg(long, default_value = "certs")]
    out: PathBuf,
    /// Replace existing region certificates.
    #[arg(long)]
    force: bool,
    /// Regions to issue certificates for.
    #[arg(required_unless_present = "client")]
    regions: Vec<String>,
    /// Also issue a client certificate (no server use) whose DNS name is
    /// NAME, written as NAME.pem / NAME.key: an administrator when a node's
    /// `[admin] identities` lists NAME.
    #[arg(long, value_name = "NAME")]
    client: Vec<String>,
}

fn dev_certs(args: DevCertsArgs) -> Result<()> {
    let mut pki = if args.out.join("ca.pem").exists() && args.out.join("ca.key").exists() {
        println!("reusing the CA in {}", args.out.display());
        DevPki::load_ca(&args.out)?
    } else {
        DevPki::generate(&[])?
    };
    for region in &args.regions {
        if args.out.join(format!("{region}.pem")).exists() && !args.force {
            println!("kept {region}.pem (exists; --force replaces it)");
            continue;
        }
        pki.add_region(region)?;
    }
    for name in &args.client {
        if args.out.join(format!("{name}.pem")).exists() && !args.force {
            println!("kept {name}.pem (exists; --force replaces it)");
            continue;
        }
        pki.add_client(name)?;
    }
    for file in pki.write(&args.out)? {
        println!("wrote {}", file.display());
    }
    Ok(())
}

/// Logs to stderr: `CASCADE_LOG` filters (default `default`); colours
/// only when stderr is a terminal (a file or a collector gets plain text);
/// `CASCADE_LOG_FORMAT=json` writes one JSON object per line, with the
/// span fields (region, name, uid) in it, for log collectors. With an OTLP
/// endpoint, spans are also exported there (see [`otlp_tracer`]); the
/// returned provider flushes them when shut down.
fn init_tracing(default: &str, otlp: Option<(&str, &str)>) -> Result<Option<SdkTracerProvider>> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = EnvFilter::try_from_env("CASCADE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let format = std::env::var("CASCADE_LOG_FORMAT");
    let fmt = match format.as_deref() {
        Ok("json") => fmt.json().with_current_span(true).with_span_list(true).boxed(),
        _ => fmt.boxed(),
    };
    let (otel, provider) = match otlp {
        Some((endpoint, region)) => {
            let provider = otlp_tracer(endpoint, region)?;
            let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "cascade");
            (Some(tracing_opentelemetry::layer().with_tracer(tracer)), Some(provider))
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    if let Ok(other) = format.as_deref() {
        if other != "json" && other != "text" {
            tracing::warn!(format = other, "CASCADE_LOG_FORMAT is text or json; logging text");
        }
    }
    Ok(provider)
}

/// Spans exported in batches to the OTLP/gRPC collector at `endpoint`, as
/// service `cascade` with the region as a resource attribute, and W3C
/// trace context as the propagator (between regions: gRPC metadata and
/// peer events, cascade-node's `trace_context.rs`).
fn otlp_tracer(endpoint: &str, region: &str) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("tracing.otlp_endpoint: {endpoint}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("cascade")
        .with_attribute(opentelemetry::KeyValue::new("cascade.region", region.to_owned()))
        .build();
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

async fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Serve(args) => {
            serve(args).await?;
            Ok(0)
        }
        Command::Demo(args) => {
            init_tracing("warn", None)?;
            demo::run(args).await?;
            Ok(0)
        }
        Command::DevCerts(args) => {
            dev_certs(args)?;
            Ok(0)
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "cascade", &mut std::io::stdout());
            Ok(0)
        }
        Command::Client(command) => {
            init_tracing("warn", None)?;
            Ok(cascade_client::cli::run(&cli.client, command).await?)
        }
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let mut file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    if args.region.is_some() {
        file.region = args.region;
    }
    if args.listen.is_some() {
        file.listen = args.listen;
    }
    if args.data_dir.is_some() {
        file.data_dir = args.data_dir;
    }
    if args.schema.is_some() {
        file.schema = args.schema;
    }
    if args.metrics_listen.is_some() {
        file.metrics_listen = args.metrics_listen;
    }
    if args.console_listen.is_some() {
        file.console.listen = args.console_listen;
    }
    if args.otlp_endpoint.is_some() {
        file.tracing.otlp_endpoint = args.otlp_endpoint;
    }
    if args.node_name.is_some() {
        file.ha.node_name = args.node_name;
    }
    if args.advertise.is_some() {
        file.ha.advertise = args.advertise;
    }
    if let Some(mode) = args.auth_mode {
        file.auth.get_or_insert_with(Default::default).mode = Some(mode);
    }
    if let Some(engine) = args.storage_engine {
        file.storage.engine = Some(engine.to_string());
    }
    let region = file.region.clone().unwrap_or_default();
    let otlp = file.tracing.otlp_endpoint.as_deref().map(|e| (e, region.as_str()));
    // The storage engines' own info lines (fjall and its LSM trees: two a
    // keyspace at every open, and at every reopen after a full disk) say
    // nothing an operator acts on; their warnings and errors still show.
    let provider = init_tracing("info,fjall=warn,lsm_tree=warn", otlp)?;
    // SIGHUP reads the policy file again (`[auth] policy_file`), as a
    // change of the file does on its own within a second, and the schema
    // file (`schema`), which a change of the file reloads too.
    cascade_node::reload_signal::reload_on_sighup();
    let served = serve_node(file, args.accept_schema_unchecked).await;
    if let Some(provider) = provider {
        // The spans still in the exporter's batch. A blocking call whose
        // export needs the runtime: off its workers.
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: flushing spans to the OTLP collector: {e}"),
            Err(e) => eprintln!("warning: flushing spans to the OTLP collector: {e}"),
        }
    }
    served
}

async fn serve_node(file: ConfigFile, accept_schema_unchecked: bool) -> Result<()> {
    let mut settings = NodeSettings::from_file(&file)?;
    settings.accept_schema_unchecked = accept_schema_unchecked;
    if settings.auth.mode == AuthMode::Off {
        tracing::warn!(
            region = %settings.region,
            "authentication is off ([auth] mode = \"none\"): anyone who can reach this node may create and \
             delete anything; set mode = \"required\" (README \"Security\") unless the network alone is trusted"
        );
    }
    if let Some(postgres) = settings.postgres.clone() {
        return serve_region_node(&file, settings, postgres).await;
    }
    if file.data_dir.is_none() {
        anyhow::bail!("data_dir: is required (in the config file, --data-dir or CASCADE_DATA_DIR)");
    }
    // The same findings as `cascade schema check` (an error already
    // refused the schema when the settings were read).
    for warning in settings.schema.check().lines() {
        tracing::warn!(%warning, "schema check");
    }
    let (listener, shutdown) = listen(&file).await?;
    let settings_tls = settings.tls.is_some();
    let node = Node::open(settings).await?;
    if let Some(addr) = node.metrics_addr() {
        // Scripts and tests read the metrics address from this line.
        println!("metrics on http://{addr}/metrics");
    }
    if let Some(addr) = node.console_addr() {
        let scheme = if settings_tls { "https" } else { "http" };
        println!("console on {scheme}://{addr}/");
    }
    node.serve(listener, shutdown).await?;
    Ok(())
}

/// A node of a region whose nodes share one PostgreSQL database: a
/// standby that forwards to the region's writer, or the writer (see
/// `cascade_node::serve_region_node`).
async fn serve_region_node(file: &ConfigFile, settings: NodeSettings, postgres: PostgresSettings) -> Result<()> {
    for warning in settings.schema.check().lines() {
        tracing::warn!(%warning, "schema check");
    }
    // Before listening: a wrong URL or password, an unreachable database,
    // or one of another region, cluster or newer version is an error at
    // start, before anyone is told the node's address.
    let (region, cluster) = (settings.region.clone(), settings.cluster.clone());
    let store = tokio::task::spawn_blocking(move || open_postgres(&postgres, &region, &cluster))
        .await
        .context("opening the PostgreSQL store")??;
    let (listener, shutdown) = listen(file).await?;
    let shared = SharedStore { store };
    serve_region_node_on(settings, shared, listener, shutdown).await?;
    Ok(())
}

/// Binds the node's `listen` address and prints it, with the shutdown
/// signal installed first.
async fn listen(file: &ConfigFile) -> Result<(tokio::net::TcpListener, impl std::future::Future<Output = ()>)> {
    let listen: SocketAddr = file
        .listen
        .as_deref()
        .unwrap_or("127.0.0.1:50051")
        .parse()
        .context("listen: expected an address like 127.0.0.1:50051")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // Before anyone can learn the address: a SIGTERM from then on stops the
    // node gracefully (tests/operating.rs sends one right after "serving").
    let shutdown = shutdown_signal();
    // Scripts and tests read the bound address (port 0 picks one) from this line.
    println!("listening on {}", listener.local_addr()?);
    Ok((listener, shutdown))
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT). The handlers are installed when
/// this is called, not when the future is first polled: a signal that
/// comes in between is not lost (it used to kill a node that had printed
/// its address but not yet started serving, instead of stopping it).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (term, interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(term) => {},
                _ = wait(interrupt) => {},
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    }
}
