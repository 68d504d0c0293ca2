//! Finding and loading a shim library: the ABI version is checked before anything else is
//! looked up, so a shim of another version is refused naming both versions (not as a missing
//! symbol), and a library that is not a shim at all is refused naming the path.

use crate::DeviceError;
use clef_tt_abi::{ClefTtLibrary, ABI_VERSION};
use std::ffi::{c_int, c_uint, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the ttnn shim (`cargo build` where a CPython 3.12/3.10 with pybind11 is found).
pub const TTNN_SHIM: &str = "libclef_tt_ttnn.so";
/// File name of the host shim (`cargo build` everywhere).
pub const HOST_SHIM: &str = "libclef_tt_host.so";

/// Why no shim could be used.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("no Tenstorrent shim found (tried {tried}); `cargo build` builds the host shim {HOST_SHIM} into target/<profile>/ (needs g++) and the ttnn shim {TTNN_SHIM} where CLEF_TT_PYTHON names a CPython 3.12/3.10 with ttnn and pybind11 (ffi/BRINGUP.md); or pass --tt-shim PATH (CLEF_TT_SHIM)")]
    NotFound { tried: String },
    #[error("cannot load the Tenstorrent shim {path}: {reason}")]
    Unloadable { path: String, reason: String },
    #[error("{path} is not a clef-tt shim: {reason}")]
    NotAShim { path: String, reason: String },
    #[error("{path} implements clef-tt shim ABI version {found}, this clef-tt needs version {expected}: rebuild the shim from this checkout (`cargo build`)")]
    Version {
        path: String,
        found: u32,
        expected: u32,
    },
}

/// A loaded shim library.
pub struct Shim {
    pub(super) lib: ClefTtLibrary,
    path: PathBuf,
    backend: String,
}

impl std::fmt::Debug for Shim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shim({}, {})", self.path.display(), self.backend)
    }
}

impl Shim {
    /// Where a shim is looked for when none is named: next to the running binary the ttnn
    /// shim, then the host shim; then the ttnn and the host shim this build made.
    pub fn candidates() -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            out.push(dir.join(TTNN_SHIM));
            out.push(dir.join(HOST_SHIM));
        }
        for built in [clef_tt_abi::TTNN_SHIM, clef_tt_abi::HOST_SHIM] {
            if !built.is_empty() {
                out.push(PathBuf::from(built));
            }
        }
        out.dedup();
        out
    }

    /// The shim at `path`, or the first of [`Shim::candidates`] that exists.
    pub fn locate(path: Option<&Path>) -> Result<PathBuf, ShimError> {
        if let Some(p) = path {
            return Ok(p.to_path_buf());
        }
        let candidates = Self::candidates();
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .ok_or_else(|| ShimError::NotFound {
                tried: candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Load the shim at `path` (or the default one) and check its ABI version.
    pub fn load(path: Option<&Path>) -> Result<Arc<Shim>, ShimError> {
        let path = Self::locate(path)?;
        let shown = path.display().to_string();
        if !path.exists() {
            return Err(ShimError::Unloadable {
                path: shown,
                reason: "no such file".into(),
            });
        }
        // SAFETY: loading a library runs its initialisers; a clef-tt shim's only set up
        // statics. The user chose this file (or it is the one this build made).
        let library = unsafe { clef_tt_abi::libloading::Library::new(&path) }.map_err(|e| {
            ShimError::Unloadable {
                path: shown.clone(),
                reason: e.to_string(),
            }
        })?;
        // SAFETY: the symbol, if present, has the C ABI's signature `uint32_t (void)`.
        let version = unsafe {
            library
                .get::<unsafe extern "C" fn() -> u32>(b"clef_tt_abi_version\0")
                .map(|f| f())
        }
        .map_err(|_| ShimError::NotAShim {
            path: shown.clone(),
            reason: "it has no clef_tt_abi_version function".into(),
        })?;
        if version != ABI_VERSION {
            return Err(ShimError::Version {
                path: shown,
                found: version,
                expected: ABI_VERSION,
            });
        }
        // SAFETY: every symbol of the header is looked up with the signature bindgen generated
        // from it; a missing one is an error, not a null pointer.
        let lib =
            unsafe { ClefTtLibrary::from_library(library) }.map_err(|e| ShimError::NotAShim {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
        // SAFETY: returns a static string.
        let backend = unsafe { text(lib.clef_tt_backend()) };
        Ok(Arc::new(Shim { lib, path, backend }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `host` or `ttnn`.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    pub fn version(&self) -> u32 {
        ABI_VERSION
    }

    /// Devices the shim's process can open.
    pub fn visible_devices(&self) -> crate::Result<u32> {
        let mut n = 0u32;
        // SAFETY: `n` outlives the call.
        self.check(unsafe { self.lib.clef_tt_visible_devices(&mut n) })?;
        Ok(n)
    }

    /// The backend's facts as JSON: backend, hardware (`host`, `mock`, `silicon`), runtime,
    /// visible devices.
    pub fn describe(&self) -> crate::Result<String> {
        // SAFETY: the buffer and `len` outlive the call; it writes at most `capacity` bytes.
        self.json_text(|out, capacity, len| unsafe {
            self.lib.clef_tt_describe(out, capacity, len)
        })
    }

    /// JSON text from one of the ABI's text functions (`call(out, capacity, len)`), retried
    /// once with the length it asked for.
    pub(super) fn json_text(
        &self,
        call: impl Fn(*mut std::ffi::c_char, usize, *mut usize) -> c_int,
    ) -> crate::Result<String> {
        let mut capacity = 4096usize;
        loop {
            let mut buf = vec![0u8; capacity];
            let mut len = 0usize;
            let status = call(
                buf.as_mut_ptr() as *mut std::ffi::c_char,
                capacity,
                &mut len,
            );
            if status as c_uint == clef_tt_abi::CLEF_TT_INVALID_ARGUMENT && len >= capacity {
                capacity = len + 1;
                continue;
            }
            self.check(status)?;
            buf.truncate(len.min(capacity));
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
    }

    /// A status of the C ABI as a result, with the calling thread's last error.
    pub(super) fn check(&self, status: c_int) -> crate::Result<()> {
        let status = status as c_uint;
        if status == clef_tt_abi::CLEF_TT_OK {
            return Ok(());
        }
        // SAFETY: the shim keeps the message alive until this thread's next call.
        let message = unsafe { text(self.lib.clef_tt_last_error()) };
        let status = match status {
            clef_tt_abi::CLEF_TT_INVALID_ARGUMENT => "invalid argument",
            clef_tt_abi::CLEF_TT_DEVICE_ERROR => "device error",
            clef_tt_abi::CLEF_TT_OUT_OF_MEMORY => "out of memory",
            clef_tt_abi::CLEF_TT_UNSUPPORTED => "unsupported",
            _ => "internal error",
        };
        Err(DeviceError::Shim { status, message })
    }
}

/// A C string the shim returned, copied (empty for null).
unsafe fn text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_string_lossy().into_owned()
}
