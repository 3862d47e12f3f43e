//! The cluster's processes, as the `setfusion` command starts them
//! (`setfusion scheduler`, `setfusion executor`): Ballista's scheduler and
//! executor with setfusion's codecs, rules, functions and settings
//! ([`super::scheduler_config`], [`super::executor_config`]).
//!
//! Both listen on `127.0.0.1` unless told otherwise: Ballista has no
//! authentication, so anyone who reaches the ports may run plans. An executor
//! reads and writes local files only under its data folders
//! ([`ConfinedFileStore`]): a plan that names any other path gets an error.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::object_store::local::LocalFileSystem;
use datafusion::object_store::path::Path;
use datafusion::object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions,
};
use futures::stream::{self, BoxStream, StreamExt};

use setfusion::config::Devices;

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

fn socket(bind: &str, port: u16) -> Result<SocketAddr> {
    format!("{bind}:{port}")
        .parse()
        .map_err(|e| DataFusionError::Configuration(format!("cannot listen on '{bind}:{port}': {e}")))
}

/// Run a setfusion-aware Ballista scheduler on `bind:port` until the process ends.
pub async fn run_scheduler(bind: &str, port: u16) -> Result<()> {
    let address = socket(bind, port)?;
    let mut config = ballista_scheduler::config::SchedulerConfig::default();
    config.bind_host = bind.to_string();
    config.bind_port = port;
    config.external_host = bind.to_string();
    let config = super::scheduler_config(config);
    let cluster = ballista_scheduler::cluster::BallistaCluster::new_from_config(&config).await.map_err(external)?;
    println!("setfusion scheduler listening on {address}");
    ballista_scheduler::scheduler_process::start_server(cluster, address, Arc::new(config)).await.map_err(external)
}

/// What `setfusion executor` was asked for.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// Address the executor listens on (its Flight and gRPC ports).
    pub bind: String,
    /// The Arrow Flight port (shuffle data); the gRPC port is `grpc_port`.
    pub port: u16,
    pub grpc_port: u16,
    /// The scheduler's host and port.
    pub scheduler_host: String,
    pub scheduler_port: u16,
    /// Tasks run at once (Ballista's vcores).
    pub concurrent_tasks: usize,
    /// The only folders whose files plans may read or write.
    pub data_dirs: Vec<PathBuf>,
    /// Shuffle files and spills (a temporary folder when `None`).
    pub work_dir: Option<PathBuf>,
    /// The GPUs this executor's selections use where a session names none
    /// (`setfusion.devices = ''`).
    pub devices: Option<Devices>,
}

/// Run a setfusion-aware Ballista executor until the process ends.
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    socket(&options.bind, options.port)?;
    if let Some(devices) = &options.devices {
        setfusion::config::set_process_devices(devices.clone());
    }
    let work_dir = match &options.work_dir {
        Some(d) => d.clone(),
        None => {
            let d = std::env::temp_dir().join(format!("setfusion-executor-{}", std::process::id()));
            std::fs::create_dir_all(&d)
                .map_err(|e| DataFusionError::Execution(format!("work folder {}: {e}", d.display())))?;
            d
        }
    };
    let work = work_dir
        .to_str()
        .ok_or_else(|| DataFusionError::Configuration(format!("work folder {work_dir:?} is not UTF-8")))?
        .to_string();
    let store: Arc<dyn ObjectStore> = Arc::new(ConfinedFileStore::new(&options.data_dirs)?);
    let temp = work.clone();
    let runtime: ballista_core::RuntimeProducer = Arc::new(move |_| {
        let runtime = RuntimeEnvBuilder::new().with_temp_file_path(temp.clone()).build()?;
        runtime.register_object_store(ObjectStoreUrl::local_filesystem().as_ref(), store.clone());
        Ok(Arc::new(runtime))
    });
    let mut config = ballista_executor::executor_process::ExecutorProcessConfig {
        bind_host: options.bind.clone(),
        external_host: Some(options.bind.clone()),
        port: options.port,
        grpc_port: options.grpc_port,
        scheduler_host: options.scheduler_host.clone(),
        scheduler_port: options.scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        vcores: options.concurrent_tasks,
        work_dir: Some(work),
        print_thread_info: false,
        ..Default::default()
    };
    config = super::executor_config(config);
    config.override_runtime_producer = Some(runtime);
    println!(
        "setfusion executor on {}:{} (gRPC {}), scheduler {}:{}, data under {}",
        options.bind,
        options.port,
        options.grpc_port,
        options.scheduler_host,
        options.scheduler_port,
        options.data_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    ballista_executor::executor_process::start_executor_process(Arc::new(config)).await.map_err(external)
}

/// The local file system, restricted to a few folders: every path a plan
/// names is resolved (symbolic links followed, `..` refused by
/// [`Path`]) and must lie under one of them. An executor registers it as its
/// `file://` store, so a plan sent to it can read no other local file.
#[derive(Debug)]
pub struct ConfinedFileStore {
    inner: LocalFileSystem,
    roots: Vec<PathBuf>,
}

impl ConfinedFileStore {
    /// A store over the folders `roots` (each must exist).
    pub fn new(roots: &[PathBuf]) -> Result<Self> {
        if roots.is_empty() {
            return Err(DataFusionError::Configuration(
                "an executor needs at least one data folder (--data-dir)".into(),
            ));
        }
        let roots = roots
            .iter()
            .map(|r| {
                std::fs::canonicalize(r)
                    .map_err(|e| DataFusionError::Configuration(format!("data folder {}: {e}", r.display())))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { inner: LocalFileSystem::new(), roots })
    }

    /// `location` resolved on the file system, if it lies under a root. A
    /// path that does not exist yet (a file being written) is judged by its
    /// nearest existing ancestor.
    fn check(&self, location: &Path) -> datafusion::object_store::Result<()> {
        let denied = |why: String| datafusion::object_store::Error::PermissionDenied {
            path: location.to_string(),
            source: why.into(),
        };
        let path = self.inner.path_to_filesystem(location)?;
        let mut probe: &FsPath = &path;
        let resolved = loop {
            match std::fs::canonicalize(probe) {
                Ok(p) => break p,
                Err(_) => match probe.parent() {
                    Some(parent) => probe = parent,
                    None => return Err(denied("cannot be resolved".into())),
                },
            }
        };
        if self.roots.iter().any(|r| resolved.starts_with(r)) {
            Ok(())
        } else {
            Err(denied(format!("{} is outside this executor's data folders", resolved.display())))
        }
    }

    fn denied_stream<T: Send + 'static>(
        e: datafusion::object_store::Error,
    ) -> BoxStream<'static, datafusion::object_store::Result<T>> {
        stream::once(async move { Err(e) }).boxed()
    }
}

impl fmt::Display for ConfinedFileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ConfinedFileStore({})",
            self.roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    }
}

#[async_trait::async_trait]
impl ObjectStore for ConfinedFileStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> datafusion::object_store::Result<PutResult> {
        self.check(location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> datafusion::object_store::Result<Box<dyn MultipartUpload>> {
        self.check(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> datafusion::object_store::Result<GetResult> {
        self.check(location)?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, datafusion::object_store::Result<Path>>,
    ) -> BoxStream<'static, datafusion::object_store::Result<Path>> {
        let roots = Arc::new(ConfinedFileStore { inner: LocalFileSystem::new(), roots: self.roots.clone() });
        let checked = locations.map(move |l| l.and_then(|l| roots.check(&l).map(|_| l))).boxed();
        self.inner.delete_stream(checked)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, datafusion::object_store::Result<ObjectMeta>> {
        match self.check(prefix.unwrap_or(&Path::default())) {
            Ok(()) => self.inner.list(prefix),
            Err(e) => Self::denied_stream(e),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, datafusion::object_store::Result<ObjectMeta>> {
        match self.check(prefix.unwrap_or(&Path::default())) {
            Ok(()) => self.inner.list_with_offset(prefix, offset),
            Err(e) => Self::denied_stream(e),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> datafusion::object_store::Result<ListResult> {
        self.check(prefix.unwrap_or(&Path::default()))?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> datafusion::object_store::Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> datafusion::object_store::Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// Free loopback ports, for tests that start cluster processes: each was
/// bound and released, so it is free unless another process takes it first.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .map_err(|e| DataFusionError::Execution(format!("no free port: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()).map_err(|e| DataFusionError::Execution(e.to_string())))
        .collect()
}

/// Wait until something listens on loopback `port` (a scheduler or executor
/// just started), at most `timeout`; an error names `what` when one of
/// `children` exits first or the time runs out.
pub fn wait_for_port(
    port: u16,
    what: &str,
    timeout: std::time::Duration,
    children: &mut [std::process::Child],
) -> Result<()> {
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        for c in children.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(DataFusionError::Execution(format!("{what}: a cluster process exited early ({status})")));
            }
        }
        if start.elapsed() > timeout {
            return Err(DataFusionError::Execution(format!(
                "{what}: nothing listens on port {port} after {} s",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(())
}

/// The cluster URL `--cluster` takes (`df://HOST:PORT`) as Ballista's client wants it.
pub fn cluster_url(url: &str) -> Result<String> {
    let rest = url.strip_prefix("df://").unwrap_or(url);
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| DataFusionError::Configuration(format!("--cluster '{url}': expected df://HOST:PORT")))?;
    port.parse::<u16>()
        .map_err(|_| DataFusionError::Configuration(format!("--cluster '{url}': '{port}' is not a port")))?;
    Ok(format!("df://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn confined_store_reads_only_under_its_folders() {
        let base = std::env::temp_dir().join(format!("setfusion-confined-{}", std::process::id()));
        let inside = base.join("data");
        let outside = base.join("secret");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(inside.join("a.txt"), b"ok").unwrap();
        std::fs::write(outside.join("b.txt"), b"no").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(outside.join("b.txt"), inside.join("link.txt")).unwrap();
        let store = ConfinedFileStore::new(std::slice::from_ref(&inside)).unwrap();
        let path = |p: &FsPath| Path::from_absolute_path(p).unwrap();
        let got =
            store.get_opts(&path(&inside.join("a.txt")), GetOptions::default()).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"ok");
        for denied in [outside.join("b.txt"), inside.join("link.txt"), PathBuf::from("/etc/passwd")] {
            let e = store.get_opts(&path(&denied), GetOptions::default()).await.unwrap_err();
            assert!(e.to_string().contains("outside this executor's data folders"), "{}: {e}", denied.display());
        }
        let listed: Vec<_> = store.list(Some(&path(&inside))).collect().await;
        assert!(listed.iter().all(|m| m.is_ok()) && !listed.is_empty());
        let listed: Vec<_> = store.list(Some(&path(&outside))).collect().await;
        assert!(listed.iter().any(|m| m.is_err()));
        let e = store
            .put_opts(&path(&outside.join("c.txt")), PutPayload::from_static(b"x"), PutOptions::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
        assert!(!outside.join("c.txt").exists());
        assert!(ConfinedFileStore::new(&[]).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn cluster_urls() {
        assert_eq!(cluster_url("df://127.0.0.1:50050").unwrap(), "df://127.0.0.1:50050");
        assert_eq!(cluster_url("localhost:7").unwrap(), "df://localhost:7");
        assert!(cluster_url("df://host").is_err());
        assert!(cluster_url("df://host:x").is_err());
    }
}
