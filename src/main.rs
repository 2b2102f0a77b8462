//! The floodgate binary: command line, logging, config loading, signals. The only place that
//! uses `anyhow`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// `floodgate top`: the terminal view of `/top` (the binary's own; the library serves `/top`).
#[path = "cli/top.rs"]
mod top_view;

use anyhow::Context;
use clap::{Parser, Subcommand};
use floodgate::config::{Config, LogFormat, Overrides};
use floodgate::metrics::Metrics;
use floodgate::proxy::Proxy;
use floodgate::server::{Reloader, Server};
use floodgate::service::Service;
use floodgate::service::rules::Rules;
use floodgate::telemetry::Telemetry;
use tokio::signal::unix::{SignalKind, signal};

/// mimalloc instead of glibc's malloc: measured 6% less CPU per proxied request (see the
/// README's Performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A rate-limiting HTTP reverse proxy: says "no" early, so a surge never reaches your API.
#[derive(Parser)]
#[command(name = "floodgate", version, about)]
struct Cli {
    /// The config file (YAML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format: human or json (default: the config's log_format, else human). `RUST_LOG`
    /// sets the filter; per-request access logs are target floodgate::access at info level.
    #[arg(long, value_name = "FORMAT", value_enum)]
    log_format: Option<LogFormatFlag>,
    #[command(subcommand)]
    command: Option<Command>,
}

/// `--log-format`: the config's `log_format`, from the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormatFlag {
    Human,
    Json,
}

impl From<LogFormatFlag> for LogFormat {
    fn from(flag: LogFormatFlag) -> LogFormat {
        match flag {
            LogFormatFlag::Human => LogFormat::Human,
            LogFormatFlag::Json => LogFormat::Json,
        }
    }
}

/// How `floodgate replay` prints its report.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReportFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config file: exit 0, or non-zero with each problem named by its field path.
    Check {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Run recorded traffic (floodgate's JSON access log or nginx's combined log) through a
    /// config's routes and limits, on the log's clock, and report what it would have denied.
    Replay {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// text (default) or json.
        #[arg(long, value_name = "FORMAT", value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
        /// Log files, read in order (`-` reads standard input).
        #[arg(value_name = "LOG", required = true)]
        logs: Vec<PathBuf>,
    },
    /// Show who is being limited right now (admin `/top`), live: d sorts by denials, r by
    /// requests, q quits.
    Top {
        /// The admin listener, http://HOST:PORT.
        #[arg(long, value_name = "URL")]
        admin: String,
        /// One route (default: every route).
        #[arg(long, value_name = "NAME")]
        route: Option<String>,
        /// Identities per route.
        #[arg(long, default_value_t = 10)]
        n: usize,
        /// How often to refresh (e.g. 1s).
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = floodgate::config::parse_duration)]
        interval: Duration,
        /// Print one snapshot and exit (also when the output is not a terminal).
        #[arg(long)]
        once: bool,
    },
    /// Print the hex SHA-256 of an API key, for a consumer's `keys_sha256`.
    HashKey {
        /// The raw key. Pass `-` to read it from standard input (keeps it out of shell history).
        key: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check { config }) => check(&config),
        Some(Command::HashKey { key }) => hash_key(&key),
        Some(Command::Top {
            admin,
            route,
            n,
            interval,
            once,
        }) => {
            let options = top_view::Options {
                admin,
                route,
                n,
                interval,
                once,
            };
            match top_view::run(&options) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("floodgate top: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Some(Command::Replay {
            config,
            format,
            logs,
        }) => replay(&config, format, &logs),
        None => {
            let Some(path) = cli.config else {
                eprintln!("floodgate: --config FILE is required (see floodgate --help)");
                return ExitCode::from(2);
            };
            match run(&path, cli.log_format) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("floodgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The environment's overrides of the config file.
fn overrides() -> Overrides {
    Overrides {
        redis_url: std::env::var("FLOODGATE_REDIS_URL").ok(),
        database_url: std::env::var("FLOODGATE_DATABASE_URL").ok(),
        env: std::env::vars().collect(),
        ..Overrides::default()
    }
}

fn check(path: &Path) -> ExitCode {
    match Config::load(path, &overrides()) {
        Ok(config) => {
            // The rate-limit service's rules: envoyproxy/ratelimit's files, each problem named
            // with its file and path.
            if let Some(service) = &config.service {
                match Rules::load(&service.config) {
                    Ok(rules) => {
                        for key in &rules.ignored {
                            eprintln!("{}: warning: {key}: read, not acted on", path.display());
                        }
                    }
                    Err(e) => {
                        for problem in &e.problems {
                            eprintln!("{}: service.config: {problem}", path.display());
                        }
                        return ExitCode::from(2);
                    }
                }
            }
            println!("{}: ok ({} routes)", path.display(), config.routes.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            for problem in &e.problems {
                eprintln!("{}: {problem}", path.display());
            }
            ExitCode::from(2)
        }
    }
}

fn replay(config: &Path, format: ReportFormat, logs: &[PathBuf]) -> ExitCode {
    let config = match Config::load(config, &overrides()) {
        Ok(config) => config,
        Err(e) => {
            for problem in &e.problems {
                eprintln!("{}: {problem}", config.display());
            }
            return ExitCode::from(2);
        }
    };
    let mut replay = floodgate::replay::Replay::new(config);
    for path in logs {
        let name = path.display().to_string();
        let read = if name == "-" {
            replay.read("-", std::io::stdin().lock())
        } else {
            std::fs::File::open(path).and_then(|file| {
                replay.read(&name, std::io::BufReader::with_capacity(1 << 20, file))
            })
        };
        if let Err(e) = read {
            eprintln!("floodgate: cannot read {name}: {e}");
            return ExitCode::from(2);
        }
    }
    let report = replay.finish();
    if format == ReportFormat::Json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    ExitCode::SUCCESS
}

fn hash_key(key: &str) -> ExitCode {
    use sha2::Digest;
    let key = if key == "-" {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_err() {
            eprintln!("floodgate: cannot read the key from standard input");
            return ExitCode::from(2);
        }
        line.trim_end_matches(['\r', '\n']).to_string()
    } else {
        key.to_string()
    };
    let digest = sha2::Sha256::digest(key.as_bytes());
    println!("{}", floodgate::limiter::hex(&digest));
    ExitCode::SUCCESS
}

/// Raises the soft limit on open files to the hard limit: each client connection is a file, and
/// the usual soft limit (1024) would let a thousand idle sockets lock everyone else out.
fn raise_fd_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}

fn init_logging(format: LogFormat) {
    // Access logs (one line per request) are off unless RUST_LOG asks for floodgate::access=info.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,floodgate::access=warn"));
    // Colour only for a terminal: a file or a pipe gets no escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_timer(floodgate::logging::CachedTime)
        .with_writer(std::io::stderr);
    // The access log's lines are written by `access_log.rs` in the same format.
    floodgate::access_log::write_json(format == LogFormat::Json);
    if format == LogFormat::Json {
        // One line per event with the request span's fields once (`floodgate replay` reads them).
        builder.json().with_span_list(false).init();
    } else {
        // Control characters a client sent are escaped: one event, one line (`logging.rs`).
        builder.fmt_fields(floodgate::logging::EscapedFields).init();
    }
}

fn run(path: &Path, log_format: Option<LogFormatFlag>) -> anyhow::Result<()> {
    let overrides = overrides();
    let config = Config::load(path, &overrides)
        .map_err(|e| anyhow::anyhow!("invalid config {}:\n{e}", path.display()))?;
    init_logging(log_format.map_or(config.log_format, LogFormat::from));
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(path.to_path_buf(), config, overrides))
}

/// How long floodgate waits at start for a remote store to be ready before it serves anyway.
const STORE_START_WAIT: Duration = Duration::from_secs(2);

async fn serve(path: PathBuf, config: Config, overrides: Overrides) -> anyhow::Result<()> {
    let proxy = Arc::new(build_proxy(&config).await?);
    start_background(&config, &proxy).await?;
    let acme_keep = acme_keep(&config, &proxy)?;
    let challenges = acme_keep.as_ref().map(|(keep, prefix)| {
        let shared = matches!(keep, floodgate::acme::Keep::Store(_)).then(|| keep.clone());
        Arc::new(floodgate::acme::Challenges::new(shared, prefix.clone()))
    });
    let mut server = Server::bind(&config, proxy.clone(), challenges.clone())
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    if let (Some((keep, _)), Some(challenges)) = (acme_keep, challenges) {
        let acme = floodgate::acme::Acme::new(
            &config,
            keep,
            server.issued(),
            challenges,
            proxy.metrics().clone(),
        );
        if let Some(acme) = acme {
            tracing::info!(domains = ?acme.domains(), "acme: looking after certificates");
            tokio::spawn(Arc::new(acme).run());
        }
    }
    let service = bind_service(&config, &proxy, &mut server).await?;
    announce(&config, &server)?;

    let mut hangup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut reloader = Reloader::new(
        proxy.clone(),
        server.settings(),
        path,
        config.clone(),
        overrides,
    );
    if let Some(service) = service {
        reloader = reloader.with_service(service);
    }
    let reloader = Arc::new(reloader);
    if let Some(docker) = config.docker.clone() {
        let status = server.discovery();
        let metrics = proxy.metrics().clone();
        tokio::spawn(floodgate::provider::run(
            docker,
            reloader.clone(),
            status,
            metrics,
        ));
    }
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            reloader.reload().await;
        }
    });
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        }
    };
    server.run(shutdown).await;
    // The region's slices of global budgets go back to the global store, or they would lapse
    // unspent if this was the region's last instance (its siblings, if any, take new ones).
    if let Some(global) = proxy.core().global() {
        let _ = tokio::time::timeout(Duration::from_secs(2), global.give_back_all()).await;
    }
    // The spans of the last requests are exported now rather than lost with the process (a
    // dead collector holds the exit back 2 s at most).
    if let Some(telemetry) = proxy.telemetry() {
        let _ = tokio::time::timeout(Duration::from_secs(2), telemetry.flush()).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The proxy on the store `config` names (waited for a little), with telemetry and global
/// budgets when the config has them.
async fn build_proxy(config: &Config) -> anyhow::Result<Proxy> {
    let limiter = config
        .storage
        .limiter_spec()
        .build()
        .context("invalid storage.url")?;
    // The first requests should be decided by the store, not spend their timeout connecting and
    // loading scripts: wait a little for it. A store still down after that is joined in the
    // background, and requests follow `on_error` meanwhile.
    if !limiter.prepare(STORE_START_WAIT).await {
        tracing::warn!(
            waited = ?STORE_START_WAIT,
            "serving before the limiter store is ready: requests follow storage.on_error until it answers"
        );
    }
    // Sweeps the in-process store (the `local` fallback, for a remote store) of full budgets.
    limiter.memory().spawn_sweeper(Duration::from_secs(5));
    let metrics = Arc::new(Metrics::with_limiter(&limiter));
    let mut proxy = Proxy::new(config, limiter.clone(), metrics.clone());
    if let Some(telemetry) = &config.telemetry {
        let (m, l) = (metrics.clone(), limiter.clone());
        let started =
            Telemetry::start(telemetry, metrics.telemetry_dropped(), move || m.render(&l))
                .context("telemetry: cannot start the OTLP exporter")?;
        tracing::info!(endpoint = %telemetry.endpoint, ratio = telemetry.sample_ratio, "OpenTelemetry on");
        proxy = proxy.with_telemetry(Arc::new(started));
    }
    if let Some(spec) = global_spec(&config.storage) {
        tracing::info!(region = %spec.region, "global budgets on (storage.global)");
        let global = floodgate::global::Global::start(spec, metrics.clone())
            .context("storage.global: cannot use the global store's URL")?;
        proxy = proxy.with_global(global);
    }
    Ok(proxy)
}

/// What runs beside the requests: upstream discovery (resolved once before the listener
/// opens, so that the first requests find their endpoints), active health checks, the shared
/// control list and quota alerts.
async fn start_background(config: &Config, proxy: &Arc<Proxy>) -> anyhow::Result<()> {
    // A machine without a readable /etc/resolv.conf can still serve a config of addresses only:
    // then discovery is off (and said so); with a name to resolve, it is an error at start.
    match floodgate::upstream::discovery::resolver(&config.resolver) {
        Ok(resolver) => {
            floodgate::upstream::discovery::resolve_all(
                proxy.pools(),
                &resolver,
                Duration::from_secs(3),
            )
            .await;
            tokio::spawn(floodgate::upstream::discovery::run(
                proxy.pools().clone(),
                resolver,
                config.resolver.refresh,
            ));
        }
        Err(e) if proxy.pools().all().iter().all(|p| p.names().is_empty()) => {
            tracing::warn!(error = %e, "no DNS resolver: upstream names will not be resolved (every upstream in the config is an address)");
        }
        Err(e) => anyhow::bail!("resolver: {e}"),
    }
    tokio::spawn(floodgate::upstream::health::run(proxy.pools().clone()));
    // Bans, overrides and resets kept in the shared store reach this instance, and come back
    // after a restart.
    // A cache purge made on another instance removes this one's entries too.
    let purging = proxy.clone();
    tokio::spawn(floodgate::control::follow(
        proxy.control().clone(),
        proxy.core().limiter().clone(),
        move |purge| {
            let purged = floodgate::admin::apply_purge(&purging, purge);
            tracing::info!(id = %purge.id, route = %purge.route, purged, "cache purged by another instance");
        },
    ));
    // Quota alerts are claimed in the shared store and sent from here.
    if let Some(alerts) = proxy.core().alerts() {
        let limiter = proxy.core().limiter().clone();
        tokio::spawn(floodgate::alerts::run(alerts.clone(), limiter));
    }
    Ok(())
}

/// The rate-limit service (`service:`), its rules loaded and its port bound, if configured.
async fn bind_service(
    config: &Config,
    proxy: &Arc<Proxy>,
    server: &mut Server,
) -> anyhow::Result<Option<Arc<Service>>> {
    let Some(service_config) = &config.service else {
        return Ok(None);
    };
    let paths = service_config.config.clone();
    let rules = tokio::task::spawn_blocking(move || Rules::load(&paths))
        .await?
        .map_err(|e| anyhow::anyhow!("service.config: {e}"))?;
    let service = Arc::new(Service::new(
        proxy.clone(),
        service_config.config.clone(),
        rules,
    ));
    server
        .bind_service(service_config.clone(), service.clone())
        .await
        .with_context(|| format!("cannot listen on {}", service_config.listen))?;
    Ok(Some(service))
}

/// Where ACME keeps its state (`tls.acme`): the shared store, else `tls.acme.dir` (made if
/// missing, readable by floodgate alone), and the prefix of its keys.
fn acme_keep(
    config: &Config,
    proxy: &Arc<Proxy>,
) -> anyhow::Result<Option<(floodgate::acme::Keep, String)>> {
    let Some(acme) = config.tls.as_ref().and_then(|t| t.acme.as_ref()) else {
        return Ok(None);
    };
    let prefix = floodgate::acme::prefix_of(acme);
    let limiter = proxy.core().limiter();
    if limiter.is_shared() {
        return Ok(Some((
            floodgate::acme::Keep::Store(limiter.clone()),
            prefix,
        )));
    }
    let dir = acme
        .dir
        .clone()
        .context("tls.acme.dir: the memory store keeps no ACME state")?;
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("tls.acme.dir: cannot make {}", dir.display()))?;
    }
    Ok(Some((floodgate::acme::Keep::Dir(dir), prefix)))
}

/// Prints the listeners' addresses: scripts and tests that ask for port 0 read the real
/// address from these lines (HTTP/3's comes before the proxy's, which tests wait for).
fn announce(config: &Config, server: &Server) -> anyhow::Result<()> {
    let addr = server.local_addr()?;
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    if let Some(addr) = server.http3_addr() {
        println!("floodgate http3 listening on udp://{addr}");
    }
    println!("floodgate listening on {scheme}://{addr}");
    if let Some(admin) = server.admin_addr() {
        println!("floodgate admin listening on http://{admin}");
    }
    if let Some(addr) = server.http_addr() {
        println!("floodgate http listening on http://{addr}");
    }
    if let Some(addr) = server.service_addr() {
        let scheme = match config.service.as_ref().is_some_and(|s| s.tls.is_some()) {
            true => "https",
            false => "http",
        };
        println!("floodgate service listening on {scheme}://{addr}");
    }
    tracing::info!(%addr, routes = config.routes.len(), "floodgate started");
    Ok(())
}

/// `storage.global` in the global module's terms (the config knows nothing of that module): the
/// global store, this region, and the region's store (one Redis server or PostgreSQL, which
/// the config checks).
fn global_spec(
    storage: &floodgate::config::StorageConfig,
) -> Option<floodgate::global::GlobalSpec> {
    let global = storage.global.as_ref()?;
    let url = match &storage.backend {
        floodgate::config::Backend::Redis { url }
        | floodgate::config::Backend::Postgres { url } => url,
        _ => return None,
    };
    Some(floodgate::global::GlobalSpec {
        url: global.url.clone(),
        region: global.region.clone(),
        region_url: url.clone(),
        lease_ttl: global.lease_ttl,
        timeout: global.timeout,
        key_prefix: storage.key_prefix.clone(),
    })
}
