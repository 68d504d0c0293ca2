//! The measurements behind `clef-tt bench`: prefill, vision tower and joint head speed on this
//! machine (`model`), a 27B-shaped chunk on a Tenstorrent mesh with its device ops (`chunk`),
//! and a running server measured over HTTP, latency and throughput (`http`). Each returns rows
//! and renders them as a markdown table; the command line only parses and prints.

/// Returns [`BenchError::Refused`] with a formatted message.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::bench::BenchError::Refused(format!($($arg)*)))
    };
}

pub mod chunk;
pub mod http;
pub mod model;

pub use model::{median, peak_rss_mib};

/// Why a benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A bad argument, an unexpected reply, or a measured bound exceeded.
    #[error("{0}")]
    Refused(String),
    /// What was measured failed (loading, a prefill, a request, ...).
    #[error(transparent)]
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

macro_rules! failed_from {
    ($($source:ty),* $(,)?) => {$(
        impl From<$source> for BenchError {
            fn from(e: $source) -> Self {
                BenchError::Failed(Box::new(e))
            }
        }
    )*};
}

failed_from!(
    clef_device::DeviceError,
    clef_device::plan::PlanError,
    clef_vision::tower::LoadError<clef_device::plan::SplitError>,
    crate::random::MakeRandomError,
    crate::backbone::LoadError,
    crate::backbone::PrefillError,
    crate::checkpoint::CheckpointError,
    crate::api::client::ClientError,
    serde_json::Error,
    std::io::Error,
);

/// A result of a benchmark.
pub type Result<T> = std::result::Result<T, BenchError>;
