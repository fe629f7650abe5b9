//! The HTTP side of `/metrics`: hyper's HTTP/1.1 server on a current-thread tokio runtime on
//! a thread of its own (so `stallscope run` and `agent`, which have no runtime, can serve, and
//! the collector's runtime never waits on a scrape). `GET /metrics` is answered from the
//! state in OpenMetrics when the scraper accepts it (Prometheus does), else in the text
//! format 0.0.4; anything else is a 404.
//!
//! Scrapers are trusted no more than anyone who can reach the port (issue 30, item 2): at
//! most [`Limits::max_connections`] are served at once (more are closed at accept), a
//! request's head must arrive within [`Limits::header_read`] (hyper's header-read timeout,
//! which needs its `Timer`: hyper-util's `TokioTimer`; it also closes a kept-alive connection
//! that idles that long), no connection lives longer than [`Limits::lifetime`], and a failed
//! `accept` (no file descriptor left) is retried after a growing pause
//! ([`ACCEPT_BACKOFF_FIRST`] doubling to [`ACCEPT_BACKOFF_MAX`]) instead of at once: the
//! pending connection stays queued, so an immediate retry fails again and spins.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};

use crate::{expose, MetricsError, MetricsState};

/// The first pause after a failed `accept`.
pub const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(10);

/// The longest pause between failed `accept`s.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(1000);

/// What one server allows its clients.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// How long a request's head may take to arrive, and a kept-alive connection may idle.
    pub header_read: Duration,
    /// How long a connection is served at most (a scraper that stops reading its answer).
    pub lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_read: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// The running server; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    accept_errors: Arc<AtomicU64>,
    /// Raised on drop: the feed's fold stops too.
    pub(super) stop_fold: Option<Arc<AtomicBool>>,
}

impl MetricsServer {
    /// The address it listens on (the port chosen when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `accept` calls that failed so far (each followed by a pause).
    pub fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(stop) = &self.stop_fold {
            stop.store(true, Ordering::Release);
        }
    }
}

/// Binds `addr` and serves on a new thread.
pub(super) fn start(
    addr: SocketAddr,
    state: Arc<Mutex<MetricsState>>,
) -> Result<MetricsServer, MetricsError> {
    let bind = |source| MetricsError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    start_on(listener, state, Limits::default()).map_err(bind)
}

/// Serves on a bound listener with `limits`, on a new thread.
pub(super) fn start_on(
    std_listener: std::net::TcpListener,
    state: Arc<Mutex<MetricsState>>,
    limits: Limits,
) -> std::io::Result<MetricsServer> {
    let local = std_listener.local_addr()?;
    std_listener.set_nonblocking(true)?;
    let (stop_tx, stop_rx) = oneshot::channel();
    let accept_errors = Arc::new(AtomicU64::new(0));
    let errors = accept_errors.clone();
    std::thread::Builder::new()
        .name("stallscope-metrics".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(std_listener) else {
                    return;
                };
                tokio::select! {
                    _ = accept_loop(listener, state, limits, errors) => {}
                    _ = stop_rx => {}
                }
            });
        })?;
    Ok(MetricsServer {
        addr: local,
        stop: Some(stop_tx),
        accept_errors,
        stop_fold: None,
    })
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<Mutex<MetricsState>>,
    limits: Limits,
    errors: Arc<AtomicU64>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = ACCEPT_BACKOFF_FIRST;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_FIRST;
                stream
            }
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream); // as many as it serves: closed at once
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let reply = answer(&req, &state);
                async move { Ok::<_, std::convert::Infallible>(reply) }
            });
            let serving = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.lifetime, serving).await;
            drop(slot);
        });
    }
}

fn answer(req: &Request<Incoming>, state: &Mutex<MetricsState>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET || !req.uri().path().starts_with("/metrics") {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "stallscope serves /metrics\n".into(),
        );
    }
    let openmetrics = req
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(expose::accepts_openmetrics);
    let text = match state.lock() {
        Ok(s) => expose::render(&s),
        Err(_) => String::new(),
    };
    if openmetrics {
        reply(StatusCode::OK, expose::CONTENT_TYPE, text)
    } else {
        reply(
            StatusCode::OK,
            expose::CONTENT_TYPE_TEXT,
            expose::to_text_format(&text),
        )
    }
}

fn reply(status: StatusCode, kind: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

#[cfg(test)]
mod tests;
