//! A SPIFFE Workload API server for tests: the real `workload.proto` served with tonic
//! on a Unix socket, as a SPIRE agent serves it. It streams X.509-SVIDs it is handed
//! and pushes a new one to every open stream on [`WorkloadApi::rotate`]. As SPIRE does,
//! it refuses calls without the `workload.spiffe.io: true` metadata.

use std::path::Path;
use std::pin::Pin;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

use pb::spiffe_workload_api_server::{SpiffeWorkloadApi, SpiffeWorkloadApiServer};
use pb::*;

/// One SVID as the API carries it: DER chain (leaf first), PKCS#8 key, DER bundle.
#[derive(Debug, Clone)]
pub struct SvidDer {
    pub spiffe_id: String,
    pub chain: Vec<u8>,
    pub key: Vec<u8>,
    pub bundle: Vec<u8>,
}

/// The running server; dropping it stops serving and ends every open stream, as an
/// agent that goes away does.
pub struct WorkloadApi {
    /// The only sender: once dropped, every stream's receiver sees the end.
    current: watch::Sender<Option<SvidDer>>,
    task: tokio::task::JoinHandle<()>,
}

impl WorkloadApi {
    /// Serves on a new Unix socket at `path`, with no SVID until [`Self::rotate`].
    pub fn serve(path: &Path) -> std::io::Result<Self> {
        let listener = UnixListener::bind(path)?;
        let current = watch::Sender::new(None);
        let svc = Service {
            current: current.subscribe(),
        };
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(SpiffeWorkloadApiServer::new(svc))
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
        });
        Ok(Self { current, task })
    }

    /// Hands every open and future FetchX509SVID stream this SVID.
    pub fn rotate(&self, svid: SvidDer) {
        self.current.send_replace(Some(svid));
    }
}

impl Drop for WorkloadApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Service {
    current: watch::Receiver<Option<SvidDer>>,
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn check_header<T>(req: &Request<T>) -> Result<(), Status> {
    match req.metadata().get("workload.spiffe.io") {
        Some(v) if v == "true" => Ok(()),
        _ => Err(Status::invalid_argument(
            "security header missing from request",
        )),
    }
}

#[tonic::async_trait]
impl SpiffeWorkloadApi for Service {
    type FetchX509SVIDStream = Stream_<X509svidResponse>;
    type FetchX509BundlesStream = Stream_<X509BundlesResponse>;
    type FetchJWTBundlesStream = Stream_<JwtBundlesResponse>;

    async fn fetch_x509svid(
        &self,
        req: Request<X509svidRequest>,
    ) -> Result<Response<Self::FetchX509SVIDStream>, Status> {
        check_header(&req)?;
        let updates = WatchStream::new(self.current.clone()).filter_map(|svid| {
            svid.map(|s| {
                Ok(X509svidResponse {
                    svids: vec![X509svid {
                        spiffe_id: s.spiffe_id,
                        x509_svid: s.chain,
                        x509_svid_key: s.key,
                        bundle: s.bundle,
                        hint: String::new(),
                    }],
                    crl: Vec::new(),
                    federated_bundles: Default::default(),
                })
            })
        });
        Ok(Response::new(Box::pin(updates)))
    }

    async fn fetch_x509_bundles(
        &self,
        _req: Request<X509BundlesRequest>,
    ) -> Result<Response<Self::FetchX509BundlesStream>, Status> {
        Err(Status::unimplemented("not in this test server"))
    }

    async fn fetch_jwtsvid(
        &self,
        _req: Request<JwtsvidRequest>,
    ) -> Result<Response<JwtsvidResponse>, Status> {
        Err(Status::unimplemented("not in this test server"))
    }

    async fn fetch_jwt_bundles(
        &self,
        _req: Request<JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        Err(Status::unimplemented("not in this test server"))
    }

    async fn validate_jwtsvid(
        &self,
        _req: Request<ValidateJwtsvidRequest>,
    ) -> Result<Response<ValidateJwtsvidResponse>, Status> {
        Err(Status::unimplemented("not in this test server"))
    }
}
