//! The end-to-end harness: the real `floodgate` binary started as a child process on port 0, in
//! front of a real HTTP/1.1 upstream started inside the test on port 0 that records every request.
//!
//! Split by what it starts: `process.rs` (floodgate itself), `upstream.rs`, `redis.rs`
//! (redis-server), `postgres.rs` (a PostgreSQL cluster), `grpc.rs` (a grpcio server and client),
//! and `client.rs` (clients and shared assertions).
//!
//! Each integration test file is its own crate and uses only part of this module; an item unused
//! by one crate is used by another, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The body the upstream answers with on its default path.
pub const UPSTREAM_BODY: &str = "hello from upstream";

/// How long the upstream sits on a `/hang…` request: far longer than any test's
/// `timeouts.upstream_response`, so floodgate must give up first.
pub const HANG: Duration = Duration::from_secs(10);

/// How long the upstream takes on a `/slow…` request: long enough to reload or shut floodgate
/// down while it is in flight, shorter than the default `timeouts.upstream_response`.
pub const SLOW: Duration = Duration::from_millis(1500);

mod client;
pub mod config;
pub mod demo;
mod envoy;
mod grpc;
mod h3client;
mod pebble;
pub mod policy;
mod postgres;
mod process;
mod proxies;
mod redis;
mod relay;
mod tls;
mod upstream;

// Each test crate uses some of these; the rest are unused there.
#[allow(unused_imports)]
pub use {
    client::*, demo::*, envoy::*, grpc::*, h3client::*, pebble::*, postgres::*, process::*,
    proxies::*, redis::*, relay::*, tls::*, upstream::*,
};
