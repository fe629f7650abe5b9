//! The smallest HTTP/1.1 server Prometheus needs: `GET /metrics` answered from the state,
//! one request per connection, on a current-thread tokio runtime on a thread of its own (so
//! `stallscope run` and `agent`, which have no runtime, can serve, and the collector's
//! runtime never waits on a scrape).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
            let _ = answer(stream, &state).await;
        });
    }
}

/// bytes, the most of a request head read.
const MAX_HEAD: usize = 8192;

async fn answer(mut stream: TcpStream, state: &Mutex<MetricsState>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, kind, body) = if line.starts_with("GET ") && path.starts_with("/metrics") {
        let body = match state.lock() {
            Ok(s) => expose::render(&s),
            Err(_) => String::new(),
        };
        ("200 OK", expose::CONTENT_TYPE, body)
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "stallscope serves /metrics\n".into(),
        )
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
