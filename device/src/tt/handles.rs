//! Owned handles of the C ABI. A tensor keeps its mesh (and the mesh its library) alive, so a
//! mesh is closed only after its last tensor was freed, and every handle is released exactly
//! once, from whichever thread drops it last (the shim serialises calls per mesh and accepts
//! frees from any thread).

use super::shim::Shim;
use crate::{DeviceError, Result};
use clef_tt_abi::{clef_tt_mesh, clef_tt_tensor, clef_tt_tensor_info};
use std::ptr::NonNull;
use std::sync::Arc;

pub(super) struct MeshHandle {
    pub shim: Arc<Shim>,
    pub raw: NonNull<clef_tt_mesh>,
    /// Op calls made through the C ABI on this mesh (every clone of its TtMesh counts here).
    pub op_calls: std::sync::atomic::AtomicU64,
    /// Whole passes the shim did not take (the caller ran their layers one by one).
    pub refused_passes: std::sync::atomic::AtomicU64,
}

// SAFETY: the shim serialises the calls on one mesh and may be called from any thread.
unsafe impl Send for MeshHandle {}
unsafe impl Sync for MeshHandle {}

impl Drop for MeshHandle {
    fn drop(&mut self) {
        // SAFETY: the mesh is open and this is its only owner; its tensors, which hold this
        // handle, are all gone. A refusal cannot be reported from a destructor.
        let _ = unsafe { self.shim.lib.clef_tt_mesh_close(self.raw.as_ptr()) };
    }
}

pub(super) struct TensorHandle {
    pub mesh: Arc<MeshHandle>,
    pub raw: NonNull<clef_tt_tensor>,
}

// SAFETY: as for MeshHandle; a tensor is only read by ops after it was made.
unsafe impl Send for TensorHandle {}
unsafe impl Sync for TensorHandle {}

impl Drop for TensorHandle {
    fn drop(&mut self) {
        // SAFETY: a live tensor of an open mesh, freed once (this is its only owner).
        let _ = unsafe { self.mesh.shim.lib.clef_tt_tensor_free(self.raw.as_ptr()) };
    }
}

impl TensorHandle {
    /// Takes ownership of a tensor a successful call wrote to `raw`.
    pub fn adopt(mesh: &Arc<MeshHandle>, raw: *mut clef_tt_tensor) -> Result<TensorHandle> {
        let raw = NonNull::new(raw).ok_or_else(|| DeviceError::Shim {
            status: "internal error",
            message: "the shim reported success without a tensor".into(),
        })?;
        Ok(TensorHandle {
            mesh: mesh.clone(),
            raw,
        })
    }

    pub fn info(&self) -> Result<clef_tt_tensor_info> {
        let mut info = clef_tt_tensor_info {
            rows: 0,
            cols: 0,
            devices: 0,
            dtype: 0,
            layout: 0,
            role: 0,
            placement: 0,
            device_bytes: 0,
            stored_bytes: 0,
        };
        let shim = &self.mesh.shim;
        // SAFETY: a live tensor; `info` outlives the call.
        shim.check(unsafe {
            shim.lib
                .clef_tt_tensor_info_get(self.raw.as_ptr(), &mut info)
        })?;
        Ok(info)
    }
}
