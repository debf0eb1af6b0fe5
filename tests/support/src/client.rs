//! HTTP/1.1 and h2c clients over hyper's connection API.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::{TcpSocket, TcpStream};

use crate::{BoxError, ensure, err};

/// How long one request (connect, send, read the body) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A response read to the end.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Result<Value, BoxError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| err(format!("body is not JSON ({e}): {:?}", self.text())))
    }

    /// The value of header `name`, if it is there and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// Asserts a 200 from the echo backend and returns its JSON description.
    pub fn echo(&self) -> Result<Echo, BoxError> {
        ensure!(
            self.status == StatusCode::OK,
            "expected 200 from an echo backend, got {}: {:?}",
            self.status,
            self.text()
        );
        Ok(Echo(self.json()?))
    }
}

/// What the echo backend saw.
#[derive(Debug)]
pub struct Echo(pub Value);

impl Echo {
    fn field(&self, key: &str) -> &str {
        self.0
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
    }
    pub fn name(&self) -> &str {
        self.field("name")
    }
    pub fn path(&self) -> &str {
        self.field("path")
    }
    pub fn host(&self) -> &str {
        self.field("host")
    }
    pub fn method(&self) -> &str {
        self.field("method")
    }
    pub fn protocol(&self) -> &str {
        self.field("protocol")
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.0
            .get("headers")
            .and_then(|h| h.get(name))
            .and_then(Value::as_str)
    }
}

/// Opens a TCP connection from `src` (port 0) to `dst`.
pub async fn connect_from(src: IpAddr, dst: SocketAddr) -> Result<TcpStream, BoxError> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(src, 0))?;
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, sock.connect(dst))
        .await
        .map_err(|_| err(format!("connect to {dst} timed out")))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

async fn read_resp(resp: http::Response<hyper::body::Incoming>) -> Result<Resp, BoxError> {
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(REQUEST_TIMEOUT, body.collect())
        .await
        .map_err(|_| err("reading the response body timed out"))??
        .to_bytes();
    Ok(Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// A keep-alive HTTP/1.1 connection.
pub struct H1Conn {
    sender: http1::SendRequest<Full<Bytes>>,
}

impl H1Conn {
    pub async fn connect(src: IpAddr, dst: SocketAddr) -> Result<Self, BoxError> {
        Self::over(connect_from(src, dst).await?).await
    }

    /// HTTP/1.1 over an already established stream (e.g. a TLS session).
    pub async fn over<S>(stream: S) -> Result<Self, BoxError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender })
    }

    /// Sends a request with `method`, `Host: host`, origin-form `path` and extra headers.
    pub async fn send(
        &mut self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Resp, BoxError> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header("host", host);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(Bytes::new()))?;
        let fut = async {
            self.sender.ready().await?;
            let resp = self.sender.send_request(req).await?;
            read_resp(resp).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .map_err(|_| err(format!("HTTP/1.1 {method} {host}{path} timed out")))?
    }

    pub async fn get(&mut self, host: &str, path: &str) -> Result<Resp, BoxError> {
        self.send("GET", host, path, &[]).await
    }

    /// Has the connection ended (the server closed it, or it failed)?
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// An h2c (prior knowledge) connection; requests can be sent concurrently.
#[derive(Clone)]
pub struct H2Conn {
    sender: http2::SendRequest<Full<Bytes>>,
}

impl H2Conn {
    pub async fn connect(src: IpAddr, dst: SocketAddr) -> Result<Self, BoxError> {
        Self::over(connect_from(src, dst).await?).await
    }

    /// HTTP/2 over an already established stream (e.g. a TLS session that chose `h2`).
    pub async fn over<S>(stream: S) -> Result<Self, BoxError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender })
    }

    /// Sends a request whose `:authority` is `host` and whose path is `path`.
    pub async fn send(
        &mut self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Resp, BoxError> {
        self.send_body(method, host, path, headers, Bytes::new())
            .await
    }

    /// The same, with a request body (sent as the edge's flow-control window allows).
    pub async fn send_body(
        &mut self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Resp, BoxError> {
        let mut b = Request::builder()
            .method(method)
            .version(http::Version::HTTP_2)
            .uri(format!("http://{host}{path}"));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(body))?;
        let fut = async {
            self.sender.ready().await?;
            let resp = self.sender.send_request(req).await?;
            read_resp(resp).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .map_err(|_| err(format!("h2c {method} {host}{path} timed out")))?
    }

    pub async fn get(&mut self, host: &str, path: &str) -> Result<Resp, BoxError> {
        self.send("GET", host, path, &[]).await
    }
}

/// One HTTP/1.1 GET on a fresh connection.
pub async fn h1_get_from(
    src: IpAddr,
    dst: SocketAddr,
    host: &str,
    path: &str,
) -> Result<Resp, BoxError> {
    H1Conn::connect(src, dst).await?.get(host, path).await
}

/// One h2c GET on a fresh connection.
pub async fn h2_get_from(
    src: IpAddr,
    dst: SocketAddr,
    host: &str,
    path: &str,
) -> Result<Resp, BoxError> {
    H2Conn::connect(src, dst).await?.get(host, path).await
}
