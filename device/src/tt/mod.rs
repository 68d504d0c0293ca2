//! The Tenstorrent backend: [`MeshOps`] through the C ABI of a shim library loaded at run time.
//!
//! ```text
//! clef-device ──MeshOps──► TtMesh (here) ──C ABI (ffi/include/clef_tt.h, bindgen)──► libclef_tt*.so
//!                                                   ├─ shim core (C++, ffi/shim/core): handles, errors, mesh +
//!                                                   │  tensor tables, argument checks, placements, copies
//!                                                   ├─ host backend (ffi/shim/host): the ops as plain loops over
//!                                                   │  ttnn's tile layout  ← built and tested everywhere
//!                                                   └─ ttnn backend: the ops as ttnn calls  ← Tenstorrent hosts only
//! ```
//!
//! Weights are split per device by the caller's plan, packed on the host (matrices as `[in,
//! out]` tiles of their format, exactly as `crate::formats` writes ttnn's bytes) and uploaded;
//! activations go up as f32 rows and stay on the device between ops; only what the host needs
//! (final rows, traces, snapshots for tests) comes back. Every tensor is an owned handle freed
//! when its last clone is dropped, so a failed op or a dropped request leaves nothing behind on
//! the device. The matmul numerics (fidelity, accumulation, bf16 activations) are passed with
//! every `linear`. `shim` finds and loads the library, `handles` owns the C handles, `ops`
//! maps every op to its C call.

mod handles;
mod layers;
mod ops;
pub mod output;
mod passes;
mod shim;

pub use shim::{Shim, ShimError, HOST_SHIM, TTNN_SHIM};

use crate::formats::{self, TileFormat};
use crate::{
    DeviceError, DeviceUsage, GatherAxis, Held, HostTensor, HostWeight, Kept, MeshShape, Numerics,
    Result, SharedBytes, WeightBytes, WeightFormat, WeightKind,
};
use clef_tt_abi as sys;
use handles::{MeshHandle, TensorHandle};
use std::ptr::{null_mut, NonNull};
use std::sync::Arc;

/// Where a worker's mesh sits: a 1xN mesh opened directly, or the 1xN submesh at a column
/// offset of a shared 1xP parent (a 1x4 box serving two 1x2 workers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshPlacement {
    pub shape: MeshShape,
    /// Columns of the parent; `None` opens the mesh directly.
    pub parent_cols: Option<usize>,
    pub submesh_offset: usize,
}

impl MeshPlacement {
    pub fn direct(shape: MeshShape) -> Self {
        MeshPlacement {
            shape,
            parent_cols: None,
            submesh_offset: 0,
        }
    }
}

/// Device open parameters of the Tenstorrent port (Tenstorrent's documentation).
const L1_SMALL_SIZE: u64 = 24576;
const COMMAND_QUEUES: u32 = 2;

/// A mesh of Tenstorrent devices (or of the host shim's simulated ones).
#[derive(Clone)]
pub struct TtMesh {
    mesh: Arc<MeshHandle>,
    placement: MeshPlacement,
    numerics: Numerics,
}

/// A tensor on a [`TtMesh`]: a shared handle, freed with its last clone.
#[derive(Clone)]
pub struct TtTensor(Arc<TensorHandle>);

/// A weight on a [`TtMesh`], with what a tensor cache records of it.
pub struct TtWeight {
    handle: TensorHandle,
    format: WeightFormat,
    kind: WeightKind,
    /// Output channels (`[out, in]` rows) of a matrix; rows of a vector.
    rows: usize,
    /// Input channels of a matrix; columns of a vector.
    cols: usize,
}

/// The ABI's dtype of a kept class.
fn kept_dtype(kept: Kept) -> sys::clef_tt_dtype {
    match kept {
        Kept::F32 => sys::CLEF_TT_F32,
        Kept::Bf16 => sys::CLEF_TT_BF16,
    }
}

fn dim(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| DeviceError::Shape {
        op,
        detail: format!("{what} {v} does not fit the C ABI"),
    })
}

/// The shim's op statistics (`{"op": [calls, seconds], ...}`), most host time first;
/// entries that do not parse are skipped.
pub fn runtime_calls(json: &str) -> Vec<crate::RuntimeCalls> {
    let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut out: Vec<crate::RuntimeCalls> = value
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(op, v)| {
                    Some(crate::RuntimeCalls {
                        op: op.clone(),
                        calls: v.get(0)?.as_u64()?,
                        seconds: v.get(1)?.as_f64()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    out
}

/// A tensor [`TtMesh::allocate`] places, per device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Allocation {
    /// A weight `[inputs, outputs]` in `format`'s tiles.
    Matrix {
        inputs: usize,
        outputs: usize,
        format: WeightFormat,
    },
    /// f32 values read elementwise (norm weights, gates, conv taps).
    Vector { values: usize },
    /// Rows of activations in the mesh's activation dtype, or f32 (DeltaNet states; allocated
    /// under the partial placement, whose descriptor the shim holds in f32).
    Activation { rows: usize, cols: usize, f32: bool },
}

impl TtMesh {
    /// Open a mesh through `shim`; matmuls compute with `numerics`, and the mesh keeps the
    /// KV cache and DeltaNet state in its dtypes (or refuses to open, naming one it cannot).
    pub fn open(shim: &Arc<Shim>, placement: MeshPlacement, numerics: Numerics) -> Result<Self> {
        let config = sys::clef_tt_mesh_config {
            cols: dim("mesh_open", "cols", placement.shape.devices())?,
            parent_cols: dim(
                "mesh_open",
                "parent cols",
                placement.parent_cols.unwrap_or(0),
            )?,
            submesh_offset: dim("mesh_open", "submesh offset", placement.submesh_offset)?,
            num_command_queues: COMMAND_QUEUES,
            l1_small_size: L1_SMALL_SIZE,
            trace_region_size: 0,
            activation_dtype: kept_dtype(numerics.kept(Held::Activation)),
            kv_dtype: kept_dtype(numerics.kv_cache),
            gdn_gate_dtype: kept_dtype(numerics.gdn_gates),
            gdn_state_dtype: kept_dtype(numerics.gdn_state),
        };
        let mut raw = null_mut();
        // SAFETY: `config` and `raw` outlive the call.
        shim.check(unsafe { shim.lib.clef_tt_mesh_open(&config, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| DeviceError::Shim {
            status: "internal error",
            message: "mesh_open reported success without a mesh".into(),
        })?;
        let mesh = Arc::new(MeshHandle {
            shim: shim.clone(),
            raw,
            op_calls: Default::default(),
            refused_passes: Default::default(),
        });
        let mut devices = 0u32;
        // SAFETY: an open mesh; `devices` outlives the call.
        shim.check(unsafe { shim.lib.clef_tt_mesh_devices(raw.as_ptr(), &mut devices) })?;
        if devices as usize != placement.shape.devices() {
            return Err(DeviceError::Mesh(format!(
                "{} (the shim opened {devices} devices)",
                placement.shape
            )));
        }
        Ok(TtMesh {
            mesh,
            placement,
            numerics,
        })
    }

    pub fn shim(&self) -> &Arc<Shim> {
        &self.mesh.shim
    }

    pub fn placement(&self) -> MeshPlacement {
        self.placement
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn raw(&self) -> *mut sys::clef_tt_mesh {
        self.mesh.raw.as_ptr()
    }

    fn devices(&self) -> usize {
        self.placement.shape.devices()
    }

    /// Device ids, memory in use per device and tensors alive.
    pub fn status(&self) -> Result<DeviceUsage> {
        let shim = self.shim();
        let n = self.devices();
        let mut ids = vec![0u32; n];
        let mut bytes = vec![0u64; n];
        let mut live = 0u64;
        let cap = dim("mesh_status", "devices", n)?;
        // SAFETY: an open mesh; the buffers hold `n` entries and outlive the calls.
        unsafe {
            shim.check(
                shim.lib
                    .clef_tt_mesh_device_ids(self.raw(), ids.as_mut_ptr(), cap),
            )?;
            shim.check(
                shim.lib
                    .clef_tt_mesh_memory(self.raw(), bytes.as_mut_ptr(), cap),
            )?;
            shim.check(shim.lib.clef_tt_mesh_live_tensors(self.raw(), &mut live))?;
        }
        Ok(DeviceUsage {
            device_ids: ids,
            bytes_per_device: bytes,
            live_tensors: live,
        })
    }

    /// The open mesh's facts as JSON (grid, device memory, activation dtype, ...).
    pub fn describe(&self) -> Result<String> {
        let shim = self.shim();
        // SAFETY: an open mesh; the buffer and `len` outlive the call.
        shim.json_text(|out, capacity, len| unsafe {
            shim.lib
                .clef_tt_mesh_describe(self.raw(), out, capacity, len)
        })
    }

    /// The calls the backend made to its runtime since the last take (ttnn ops for the ttnn
    /// shim), as JSON `{"op": [calls, host seconds]}`; zeroes them.
    pub fn take_op_stats(&self) -> Result<String> {
        let shim = self.shim();
        // SAFETY: an open mesh; the buffer and `len` outlive the call.
        shim.json_text(|out, capacity, len| unsafe {
            shim.lib
                .clef_tt_mesh_take_op_stats(self.raw(), out, capacity, len)
        })
    }

    /// Device memory for one tensor on every device, its values unset (no host data moves):
    /// what a placement plan checks against the device's allocator.
    pub fn allocate(&self, what: Allocation) -> Result<TtTensor> {
        let spread = if self.devices() > 1 {
            sys::CLEF_TT_SHARDED
        } else {
            sys::CLEF_TT_REPLICATED
        };
        let (rows, cols, dtype, layout, role, placement) = match what {
            Allocation::Matrix {
                inputs,
                outputs,
                format,
            } => (
                inputs,
                outputs,
                dtype(format),
                sys::CLEF_TT_TILE,
                sys::CLEF_TT_MATRIX,
                spread,
            ),
            Allocation::Vector { values } => (
                values,
                1,
                sys::CLEF_TT_F32,
                sys::CLEF_TT_ROW_MAJOR,
                sys::CLEF_TT_VECTOR,
                spread,
            ),
            Allocation::Activation { rows, cols, f32 } => (
                rows,
                cols,
                sys::CLEF_TT_F32,
                sys::CLEF_TT_ROW_MAJOR,
                sys::CLEF_TT_ACTIVATION,
                if f32 { sys::CLEF_TT_PARTIAL } else { spread },
            ),
        };
        let desc = sys::clef_tt_tensor_desc {
            rows: dim("allocate", "rows", rows)?,
            cols: dim("allocate", "cols", cols)?,
            dtype,
            layout,
            role,
            placement,
        };
        // SAFETY: an open mesh; `desc` outlives the call.
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_tensor_allocate(self.raw(), &desc, out)
        })
    }

    /// A copy of `t` in new device buffers (the device-side copy prefix-cache slots need when
    /// a backend updates states in place).
    pub fn copy(&self, t: &TtTensor) -> Result<TtTensor> {
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_tensor_copy(self.raw(), t.raw(), out)
        })
    }

    /// What device `d` holds of a weight, decoded to f32: a matrix as `[in, out]` rows (its
    /// tiles as the device reads them), a vector as uploaded. For checks and bring-up.
    pub fn download_weight(&self, w: &TtWeight, d: usize) -> Result<HostTensor> {
        self.download(&w.handle, d)
    }

    fn adopt(&self, raw: *mut sys::clef_tt_tensor) -> Result<TtTensor> {
        Ok(TtTensor(Arc::new(TensorHandle::adopt(&self.mesh, raw)?)))
    }

    /// Count one op call through the C ABI.
    fn count_call(&self) {
        self.mesh
            .op_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Op calls made through the C ABI since the last take (one per op or layer op; uploads,
    /// downloads and queries not counted).
    pub fn take_op_calls(&self) -> u64 {
        self.mesh
            .op_calls
            .swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// A request to the backend that is not an op (`clef_tt_mesh_command`, JSON in and out):
    /// the ttnn shim's graph capture ({"graph_capture": "begin" | "end"}). Runs once (the
    /// answer is read into a buffer of 1 MiB, never retried).
    pub fn command(&self, request: &str) -> Result<String> {
        let request = std::ffi::CString::new(request).map_err(|_| DeviceError::Shape {
            op: "mesh_command",
            detail: "a request with a NUL".into(),
        })?;
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0usize;
        // SAFETY: an open mesh; the request, the buffer and `len` outlive the call, which
        // writes at most the buffer's length.
        let status = unsafe {
            self.shim().lib.clef_tt_mesh_command(
                self.raw(),
                request.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut len,
            )
        };
        self.shim().check(status)?;
        buf.truncate(len.min(buf.len()));
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// A matrix weight of `outputs` x `inputs` per device in `format`, allocated on the
    /// devices with its values unset (no host data moves): synthetic weights for measuring
    /// a model's device path without uploading it (`clef-tt bench prefill --shape`).
    pub fn allocate_weight(
        &self,
        outputs: usize,
        inputs: usize,
        format: WeightFormat,
    ) -> Result<TtWeight> {
        let t = self.allocate(Allocation::Matrix {
            inputs,
            outputs,
            format,
        })?;
        let handle = Arc::try_unwrap(t.0).map_err(|_| DeviceError::Shim {
            status: "internal error",
            message: "a new allocation is shared".into(),
        })?;
        Ok(TtWeight {
            handle,
            format,
            kind: WeightKind::Matrix,
            rows: outputs,
            cols: inputs,
        })
    }

    /// Runs a call with one output tensor.
    fn call1(&self, f: impl FnOnce(*mut *mut sys::clef_tt_tensor) -> i32) -> Result<TtTensor> {
        self.count_call();
        let mut out = null_mut();
        self.shim().check(f(&mut out))?;
        self.adopt(out)
    }

    /// Upload host bytes (`parts`: one per device, or one replicated).
    fn upload(&self, desc: &sys::clef_tt_tensor_desc, parts: &[&[u8]]) -> Result<TensorHandle> {
        let host: Vec<sys::clef_tt_host_part> = parts
            .iter()
            .map(|p| sys::clef_tt_host_part {
                data: p.as_ptr().cast(),
                bytes: p.len(),
            })
            .collect();
        let n = dim("upload", "parts", host.len())?;
        let mut out = null_mut();
        // SAFETY: `desc`, the part descriptors and the bytes they point to outlive the call
        // (the shim copies them before returning).
        self.shim().check(unsafe {
            self.shim()
                .lib
                .clef_tt_tensor_upload(self.raw(), desc, host.as_ptr(), n, &mut out)
        })?;
        TensorHandle::adopt(&self.mesh, out)
    }

    fn upload_rows(&self, parts: &[&HostTensor], placement: u32) -> Result<TtTensor> {
        let first = parts.first().ok_or(DeviceError::Parts {
            op: "upload",
            got: 0,
            devices: self.devices(),
        })?;
        if parts
            .iter()
            .any(|p| p.rows != first.rows || p.cols != first.cols)
        {
            return Err(DeviceError::Shape {
                op: "shard",
                detail: "device parts of different shapes".into(),
            });
        }
        let bytes: Vec<std::borrow::Cow<'_, [u8]>> =
            parts.iter().map(|p| f32_le_bytes(&p.data)).collect();
        let desc = sys::clef_tt_tensor_desc {
            rows: dim("upload", "rows", first.rows)?,
            cols: dim("upload", "cols", first.cols)?,
            dtype: sys::CLEF_TT_F32,
            layout: sys::CLEF_TT_ROW_MAJOR,
            role: sys::CLEF_TT_ACTIVATION,
            placement,
        };
        let slices: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
        Ok(TtTensor(Arc::new(self.upload(&desc, &slices)?)))
    }

    /// Device `d`'s part of a tensor as f32 rows.
    fn download(&self, t: &TensorHandle, d: usize) -> Result<HostTensor> {
        let info = t.info()?;
        let (rows, cols) = (info.rows as usize, info.cols as usize);
        let n = rows * cols;
        // Not zeroed first: the shim writes every value (a chunk's rows are 20 MB at 1,024
        // tokens of Clef 27B; zeroing them cost as much as the download).
        let mut data: Vec<f32> = Vec::with_capacity(n);
        let shim = self.shim();
        let device = dim("download", "device", d)?;
        // SAFETY: a live tensor; `data` has room for n floats.
        shim.check(unsafe {
            shim.lib
                .clef_tt_tensor_download(t.raw.as_ptr(), device, data.as_mut_ptr(), n)
        })?;
        // SAFETY: on success the shim wrote all rows * cols values (clef_tt.h).
        unsafe { data.set_len(n) };
        Ok(HostTensor::new(rows, cols, data))
    }

    fn placement_of(t: &TtTensor) -> Result<u32> {
        Ok(t.0.info()?.placement)
    }

    fn upload_weight_parts(
        &self,
        parts: Vec<HostWeight>,
        format: WeightFormat,
        kind: WeightKind,
    ) -> Result<TtWeight> {
        if parts.len() != self.devices() {
            return Err(DeviceError::Parts {
                op: "upload_weight",
                got: parts.len(),
                devices: self.devices(),
            });
        }
        let (rows, cols) = (parts[0].rows, parts[0].cols);
        if parts.iter().any(|p| p.rows != rows || p.cols != cols) {
            return Err(DeviceError::Shape {
                op: "upload_weight",
                detail: "device parts of different shapes".into(),
            });
        }
        let bytes: Vec<Vec<u8>> = match kind {
            // [out, in] → [in, out] tiles of the format, as ttnn holds a linear's weight.
            WeightKind::Matrix => parts
                .iter()
                .map(|p| {
                    let values = p.to_f32();
                    let mut kn = vec![0.0f32; rows * cols];
                    for (o, row) in values.chunks(cols).enumerate() {
                        for (i, v) in row.iter().enumerate() {
                            kn[i * rows + o] = *v;
                        }
                    }
                    formats::pack(&kn, cols, rows, TileFormat::of(format))
                })
                .collect(),
            WeightKind::Vector => parts
                .iter()
                .map(|p| p.to_f32().iter().flat_map(|v| v.to_le_bytes()).collect())
                .collect(),
        };
        let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let format = match kind {
            WeightKind::Matrix => format,
            WeightKind::Vector => WeightFormat::F32,
        };
        self.place_weight(&slices, rows, cols, format, kind)
    }

    /// Upload one weight's device parts, already in the backend's layout.
    fn place_weight(
        &self,
        parts: &[&[u8]],
        rows: usize,
        cols: usize,
        format: WeightFormat,
        kind: WeightKind,
    ) -> Result<TtWeight> {
        let op = "upload_weight";
        let desc = match kind {
            WeightKind::Matrix => sys::clef_tt_tensor_desc {
                rows: dim(op, "input channels", cols)?,
                cols: dim(op, "output channels", rows)?,
                dtype: dtype(format),
                layout: sys::CLEF_TT_TILE,
                role: sys::CLEF_TT_MATRIX,
                placement: sys::CLEF_TT_SHARDED,
            },
            WeightKind::Vector => sys::clef_tt_tensor_desc {
                rows: dim(op, "rows", rows)?,
                cols: dim(op, "cols", cols)?,
                dtype: sys::CLEF_TT_F32,
                layout: sys::CLEF_TT_ROW_MAJOR,
                role: sys::CLEF_TT_VECTOR,
                placement: sys::CLEF_TT_SHARDED,
            },
        };
        Ok(TtWeight {
            handle: self.upload(&desc, parts)?,
            format,
            kind,
            rows,
            cols,
        })
    }

    fn export(&self, w: &TtWeight) -> Result<Vec<WeightBytes>> {
        let info = w.handle.info()?;
        let shim = self.shim();
        (0..self.devices())
            .map(|d| {
                let mut bytes = vec![0u8; info.stored_bytes as usize];
                // SAFETY: a live tensor; `bytes` holds stored_bytes bytes.
                shim.check(unsafe {
                    shim.lib.clef_tt_tensor_read_stored(
                        w.handle.raw.as_ptr(),
                        dim("export_weight", "device", d)?,
                        bytes.as_mut_ptr().cast(),
                        bytes.len(),
                    )
                })?;
                Ok(WeightBytes {
                    kind: w.kind,
                    format: w.format,
                    rows: w.rows,
                    cols: w.cols,
                    data: SharedBytes::owned(bytes),
                })
            })
            .collect()
    }

    fn import(&self, parts: Vec<WeightBytes>) -> Result<TtWeight> {
        let first = parts.first().ok_or(DeviceError::Parts {
            op: "import_weight",
            got: 0,
            devices: self.devices(),
        })?;
        let (rows, cols, format, kind) = (first.rows, first.cols, first.format, first.kind);
        if parts.len() != self.devices()
            || parts
                .iter()
                .any(|p| (p.rows, p.cols, p.format, p.kind) != (rows, cols, format, kind))
        {
            return Err(DeviceError::Shape {
                op: "import_weight",
                detail: format!(
                    "{} parts that differ in shape or format for a mesh of {}",
                    parts.len(),
                    self.devices()
                ),
            });
        }
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p.data[..]).collect();
        self.place_weight(&slices, rows, cols, format, kind)
    }

    fn gather_rows(&self, t: &TtTensor, axis: GatherAxis) -> Result<HostTensor> {
        match Self::placement_of(t)? {
            sys::CLEF_TT_REPLICATED => self.download(&t.0, 0),
            sys::CLEF_TT_PARTIAL => {
                let sum = crate::MeshOps::all_reduce(self, t)?;
                self.download(&sum.0, 0)
            }
            _ => {
                let parts: Vec<HostTensor> = (0..self.devices())
                    .map(|d| self.download(&t.0, d))
                    .collect::<Result<_>>()?;
                Ok(join(&parts, axis))
            }
        }
    }
}

/// f32 values as the ABI's little-endian bytes: borrowed on a little-endian host (no copy of a
/// chunk's rows: 20 MB at 1,024 tokens of Clef 27B), copied otherwise.
fn f32_le_bytes(v: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and any bytes are valid u8s; u8's alignment is 1; the
        // length is exactly the values' size, borrowed for the values' lifetime.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// Per-device parts joined into one matrix along `axis` (all parts have one shape).
fn join(parts: &[HostTensor], axis: GatherAxis) -> HostTensor {
    let (rows, cols) = (parts[0].rows, parts[0].cols);
    match axis {
        GatherAxis::Rows => HostTensor::new(
            rows * parts.len(),
            cols,
            parts.iter().flat_map(|p| p.data.iter().copied()).collect(),
        ),
        GatherAxis::Cols => {
            let mut data = Vec::with_capacity(rows * cols * parts.len());
            for r in 0..rows {
                for p in parts {
                    data.extend_from_slice(p.row(r));
                }
            }
            HostTensor::new(rows, cols * parts.len(), data)
        }
    }
}

fn dtype(format: WeightFormat) -> u32 {
    match format {
        WeightFormat::F32 => sys::CLEF_TT_F32,
        WeightFormat::Bf16 => sys::CLEF_TT_BF16,
        WeightFormat::Bfp8 => sys::CLEF_TT_BFP8_B,
        WeightFormat::Bfp4 => sys::CLEF_TT_BFP4_B,
    }
}

impl TtTensor {
    fn raw(&self) -> *const sys::clef_tt_tensor {
        self.0.raw.as_ptr()
    }
}

impl TtWeight {
    fn raw(&self) -> *const sys::clef_tt_tensor {
        self.handle.raw.as_ptr()
    }
}
