//! A fake container engine for `scripts/callgrind.sh DISCOVERED=1`: the tests' fake Engine API
//! (`tests/common/engine.rs`) on a Unix socket, holding one running container whose labels make
//! the route the script's file route would be (`bench`, `/`, the token bucket), at the upstream's
//! port. Prints the socket's `unix://` endpoint, then serves until killed.
//!
//! Usage: fake_engine DIR PORT CAPACITY REFILL_RATE

#[path = "../tests/common/engine.rs"]
#[allow(dead_code)]
mod engine;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, port, capacity, refill] = args.as_slice() else {
        eprintln!("usage: fake_engine DIR PORT CAPACITY REFILL_RATE");
        std::process::exit(2);
    };
    let port: u16 = port.parse().expect("a port");
    let engine = engine::Engine::start(std::path::Path::new(dir), engine::Dialect::Docker).await;
    let limits =
        format!("[{{algorithm: token_bucket, capacity: {capacity}, refill_rate: {refill}}}]");
    engine.put(engine::Container::new(
        "bench",
        "bench",
        "127.0.0.1",
        port,
        &[
            ("floodgate.enable", "true"),
            ("floodgate.route.name", "bench"),
            ("floodgate.route.path_prefix", "/"),
            ("floodgate.route.limits", &limits),
        ],
    ));
    println!("{}", engine.endpoint());
    std::future::pending::<()>().await;
}
