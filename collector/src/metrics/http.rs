//! The HTTP side of `/metrics`: hyper's HTTP/1.1 server on a current-thread tokio runtime on
//! a thread of its own (so `stallscope run` and `agent`, which have no runtime, can serve, and
//! the collector's runtime never waits on a scrape). `GET /metrics` is answered from the
//! state in OpenMetrics when the scraper accepts it (Prometheus does), else in the text
//! format 0.0.4; anything else is a 404.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::{expose, MetricsError, MetricsState};

/// The running server; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl MetricsServer {
    /// The address it listens on (the port chosen when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `addr` and serves on a new thread.
pub(super) fn start(
    addr: SocketAddr,
    state: Arc<Mutex<MetricsState>>,
) -> Result<MetricsServer, MetricsError> {
    let std_listener =
        std::net::TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let local = std_listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    std_listener
        .set_nonblocking(true)
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let (stop_tx, stop_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("stallscope-metrics".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(std_listener) else {
                    return;
                };
                tokio::select! {
                    _ = accept_loop(listener, state) => {}
                    _ = stop_rx => {}
                }
            });
        })
        .map_err(MetricsError::Thread)?;
    Ok(MetricsServer {
        addr: local,
        stop: Some(stop_tx),
    })
}

async fn accept_loop(listener: TcpListener, state: Arc<Mutex<MetricsState>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let reply = answer(&req, &state);
                async move { Ok::<_, std::convert::Infallible>(reply) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
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
