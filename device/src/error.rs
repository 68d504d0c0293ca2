//! Errors raised by the device layer.

use thiserror::Error;

/// Everything that can go wrong inside a device operation.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// Two operands do not fit together (the op and the shapes are named).
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    /// An operand has the wrong placement on the mesh (replicated vs sharded vs partial).
    #[error("{op}: expected a {expected} tensor, got a {got} one")]
    Layout {
        op: &'static str,
        expected: &'static str,
        got: &'static str,
    },
    /// A mesh shape that this build cannot open.
    #[error("unsupported mesh shape {0}: expected 1x1, 1x2 or 1x4")]
    Mesh(String),
    /// The number of per-device parts does not match the mesh.
    #[error("{op}: {got} per-device parts for a mesh of {devices} devices")]
    Parts {
        op: &'static str,
        got: usize,
        devices: usize,
    },
    /// The backend does not implement this op.
    #[error("{op} is not implemented by the {backend} backend")]
    Unsupported {
        op: &'static str,
        backend: &'static str,
    },
    /// The prefill was cancelled between two chunks.
    #[error("cancelled")]
    Cancelled,
    /// The Tenstorrent shim refused a call or its device failed; `message` is the shim's (it
    /// names the op and the argument).
    #[error("tt shim ({status}): {message}")]
    Shim {
        status: &'static str,
        message: String,
    },
    /// No usable shim library.
    #[error(transparent)]
    Load(#[from] crate::tt::ShimError),
}
