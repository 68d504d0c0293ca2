//! The backend a run uses and where its workers' meshes sit: [`Backend`] is the CPU mesh or a
//! Tenstorrent mesh through a shim library loaded at run time; [`MeshLayout`] places worker
//! `i`'s mesh (direct, or a submesh of a parent) and opens it. Also the text of
//! `clef-tt devices` ([`report`], [`check`]): what a backend offers, opened or not.

use crate::tt::{MeshPlacement, Shim, TtMesh};
use crate::{DeviceError, MeshShape, Numerics, Result};
use serde_json::{json, Value};
use std::sync::Arc;

/// The backend chosen for a run.
#[derive(Clone)]
pub enum Backend {
    Cpu,
    Tt(Arc<Shim>),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Tt(_) => "tt",
        }
    }

    /// What the model card and the log say of the backend: for `tt`, the shim, its ABI, and
    /// what runs the ops (`host`: simulated; `mock`: tt-metal's mock cluster, no device data;
    /// `silicon`) with the runtime (ttnn's version).
    pub fn describe(&self) -> Value {
        match self {
            Backend::Cpu => json!({"kind": "cpu"}),
            Backend::Tt(shim) => {
                let facts = shim_facts(shim).unwrap_or_default();
                json!({
                    "kind": "tt",
                    "shim": shim.path().display().to_string(),
                    "abi_version": shim.version(),
                    "backend": shim.backend(),
                    "hardware": facts["hardware"],
                    "runtime": facts["runtime"],
                })
            }
        }
    }
}

/// The shim's facts (`describe`), parsed.
fn shim_facts(shim: &Shim) -> Result<Value> {
    serde_json::from_str(&shim.describe()?).map_err(|e| DeviceError::Shim {
        status: "describe",
        message: format!("the shim's facts are not JSON: {e}"),
    })
}

/// What runs a shim's ops: `silicon`, `mock` or `host` (`tt` when the shim does not say).
pub fn hardware(shim: &Shim) -> String {
    shim_facts(shim)
        .ok()
        .and_then(|v| v["hardware"].as_str().map(str::to_string))
        .unwrap_or_else(|| "tt".into())
}

/// How the workers' meshes sit on the devices.
#[derive(Clone, Copy, Debug)]
pub struct MeshLayout {
    pub shape: MeshShape,
    /// A parent mesh the workers' submeshes are taken from.
    pub parent: Option<MeshShape>,
    /// Parent column of worker 0's submesh.
    pub first_offset: usize,
    pub workers: usize,
}

impl MeshLayout {
    pub fn single(shape: MeshShape) -> Self {
        MeshLayout {
            shape,
            parent: None,
            first_offset: 0,
            workers: 1,
        }
    }

    /// Worker `i`'s mesh: direct for one worker without a parent; otherwise the submesh at
    /// `first_offset + i * cols` of the parent (by default as wide as all workers together).
    /// [`MeshLayout::open_tt`] also takes a parent when the shim sees more chips than one
    /// mesh needs.
    pub fn placement(&self, worker: usize) -> MeshPlacement {
        let parent = self.parent.map(|p| p.cols).or_else(|| {
            (self.workers > 1 || self.first_offset > 0)
                .then(|| self.first_offset + self.shape.cols * self.workers)
        });
        match parent {
            None => MeshPlacement::direct(self.shape),
            Some(cols) => MeshPlacement {
                shape: self.shape,
                parent_cols: Some(cols),
                submesh_offset: self.first_offset + worker * self.shape.cols,
            },
        }
    }

    /// Opens worker `worker`'s Tenstorrent mesh.
    pub fn open_tt(&self, shim: &Arc<Shim>, worker: usize, numerics: Numerics) -> Result<TtMesh> {
        let mut placement = self.placement(worker);
        // The port's rule: a direct 1xN open only when exactly N chips are visible; with
        // more, a parent over the visible chips (a multiple of N, at most 1x4 on a line) and
        // the submesh at the configured offset (a direct 1x2 open timed out on a 4-chip box).
        if placement.parent_cols.is_none() {
            let visible = shim.visible_devices()? as usize;
            let cols = self.shape.cols;
            let parent = (visible.min(4) / cols) * cols;
            if parent > cols {
                placement.parent_cols = Some(parent);
            }
        }
        TtMesh::open(shim, placement, numerics).map_err(|e| DeviceError::Shim {
            status: "open",
            message: format!(
                "opening the {} mesh of worker {worker} through {}: {e}",
                self.shape,
                shim.path().display()
            ),
        })
    }
}

/// `clef-tt devices --check`: the backend loads, no device touched (for `tt`: the shim, its
/// embedded CPython, ttnn and the op package, all started by the backend's `describe`, which
/// reports the chips it sees without opening them).
pub fn check(backend: &Backend) -> Result<String> {
    match backend {
        Backend::Cpu => Ok("device: cpu: ok\n".into()),
        Backend::Tt(shim) => {
            let facts = shim_facts(shim).map_err(|e| DeviceError::Shim {
                status: "describe",
                message: format!("the shim {} does not start: {e}", shim.path().display()),
            })?;
            let visible = match facts["devices"].as_u64() {
                Some(n) => n.to_string(),
                None => format!("none ({})", facts["devices_error"].as_str().unwrap_or("?")),
            };
            Ok(format!(
                "device: tt: ok\nshim: {}\nbackend: {}\nruntime: {}\nhardware: {}\ndevices visible: {visible}\n",
                shim.path().display(),
                shim.backend(),
                facts["runtime"].as_str().unwrap_or("?"),
                facts["hardware"].as_str().unwrap_or("?"),
            ))
        }
    }
}

/// What `clef-tt devices` found: its text, and the meshes that did not open.
pub struct Report {
    pub text: String,
    pub failed: Vec<String>,
}

/// `clef-tt devices`: what the backend offers; for `tt`, each mesh it can open.
pub fn report(backend: &Backend) -> Result<Report> {
    let mut out = String::new();
    let mut failed = Vec::new();
    match backend {
        Backend::Cpu => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            out.push_str(&format!(
                "device: cpu (the clef-device CPU mesh: 1x1, or 1x2 simulated devices)\ncores: {cores}\nvector units: {}\nkernels: {}\n",
                cpu_features(),
                crate::cpu::isa::isa().name()
            ));
        }
        Backend::Tt(shim) => {
            let facts = shim_facts(shim)?;
            let fact = |k: &str| facts[k].as_str().unwrap_or("?").to_string();
            let hardware = fact("hardware");
            out.push_str(&format!(
                "device: tt\nshim: {}\nabi version: {}\nbackend: {}\nhardware: {hardware}{}\nruntime: {}\n",
                shim.path().display(),
                shim.version(),
                shim.backend(),
                match hardware.as_str() {
                    "host" => " (simulated devices in host memory; no Tenstorrent hardware is used)",
                    "mock" => " (tt-metal's mock cluster: real host code, validation and allocation; device data are not computed)",
                    _ => "",
                },
                fact("runtime"),
            ));
            let visible = shim.visible_devices()?;
            out.push_str(&format!("devices visible: {visible}\n"));
            let mut meshes = Vec::new();
            if visible >= 4 {
                let sub = MeshPlacement {
                    shape: MeshShape::PAIR,
                    parent_cols: Some(4),
                    submesh_offset: 0,
                };
                meshes.push(("1x2 submesh of a 1x4 parent".to_string(), sub));
            }
            for shape in [MeshShape::ONE, MeshShape::PAIR] {
                if shape.devices() > visible as usize {
                    out.push_str(&format!(
                        "{shape} mesh: needs {} devices, {visible} visible\n",
                        shape.devices()
                    ));
                    continue;
                }
                meshes.push((format!("{shape} mesh"), MeshPlacement::direct(shape)));
            }
            for (label, placement) in meshes {
                let numerics = Numerics::default().with_bf16_kv();
                match TtMesh::open(shim, placement, numerics).and_then(|m| mesh_line(&m)) {
                    Ok(line) => out.push_str(&format!("{label}: {line}\n")),
                    Err(e) => {
                        out.push_str(&format!("{label}: does not open: {e}\n"));
                        failed.push(label);
                    }
                }
            }
        }
    }
    Ok(Report { text: out, failed })
}

/// "opens (devices [..])" and what the backend tells of the open mesh (grid, device memory).
fn mesh_line(m: &TtMesh) -> Result<String> {
    let status = m.status()?;
    let facts: Value = serde_json::from_str(&m.describe()?).unwrap_or_default();
    let mut line = format!("opens (devices {:?})", status.device_ids);
    if let Some([x, y]) = facts["compute_grid"].as_array().map(|g| [&g[0], &g[1]]) {
        line.push_str(&format!(", compute grid {x}x{y}"));
    }
    if let Some(dram) = facts["dram_bytes_per_device"].as_u64() {
        line.push_str(&format!(
            ", DRAM {:.2} GiB per device",
            dram as f64 / (1u64 << 30) as f64
        ));
    }
    Ok(line)
}

/// The vector instruction sets of this CPU that clef-device can use.
fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let f: Vec<&str> = [
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            (
                "avx512bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
        ]
        .into_iter()
        .filter_map(|(name, has)| has.then_some(name))
        .collect();
        if f.is_empty() {
            "none (portable code)".into()
        } else {
            f.join(", ")
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "portable code".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_take_consecutive_submeshes_of_one_parent() {
        let one = MeshLayout::single(MeshShape::PAIR);
        assert_eq!(one.placement(0), MeshPlacement::direct(MeshShape::PAIR));
        let two = MeshLayout { workers: 2, ..one };
        assert_eq!(two.placement(0).parent_cols, Some(4));
        assert_eq!(two.placement(1).submesh_offset, 2);
        let offset = MeshLayout {
            parent: Some("1x4".parse().unwrap()),
            first_offset: 2,
            ..one
        };
        assert_eq!(offset.placement(0).submesh_offset, 2);
        assert_eq!(offset.placement(0).parent_cols, Some(4));
    }
}
