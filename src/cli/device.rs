//! The device a command runs on (`--device cpu|tt`, `--tt-shim`): the CPU mesh, or a
//! Tenstorrent mesh through a shim library loaded at run time. Commands are written once over
//! `MeshOps`; [`on_device!`] instantiates them for the chosen backend with a function that opens
//! worker `i`'s mesh. Also `clef-tt devices`.

use super::args::DeviceArgs;
use anyhow::Context;
use clef_device::tt::{MeshPlacement, Shim, TtMesh};
use clef_device::{MeshShape, Numerics};
use clef_tt::precision::Precision;
use serde_json::{json, Value};
use std::sync::Arc;

/// The backend chosen for this run.
pub enum Device {
    Cpu,
    Tt(Arc<Shim>),
}

impl DeviceArgs {
    /// The device, with its shim loaded (and checked) for `tt`; tt-metal's log and generated
    /// files kept out of stdout and the working directory (`tt_output`).
    pub fn resolve(&self) -> anyhow::Result<Device> {
        self.load(true)
    }

    /// [`DeviceArgs::resolve`] for `serve`: tt-metal's log stays where tt-metal writes it (the
    /// service's log); only its generated files move.
    pub fn resolve_for_serving(&self) -> anyhow::Result<Device> {
        self.load(false)
    }

    fn load(&self, log_to_file: bool) -> anyhow::Result<Device> {
        match self.device.as_str() {
            "tt" => {
                super::tt_output::place(log_to_file);
                Ok(Device::Tt(Shim::load(self.tt_shim.as_deref())?))
            }
            _ => Ok(Device::Cpu),
        }
    }
}

impl Device {
    pub fn name(&self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Tt(_) => "tt",
        }
    }

    /// The precision profile asked for, else the device's default (the reference's f32 on
    /// the CPU, the port's `selected` on Tenstorrent).
    pub fn precision(&self, asked: Option<&str>) -> anyhow::Result<Precision> {
        let default = match self {
            Device::Cpu => "f32",
            Device::Tt(_) => "selected",
        };
        Ok(Precision::from_env(asked.unwrap_or(default))?)
    }

    /// What the card and the log say of the backend.
    pub fn describe(&self) -> Value {
        match self {
            Device::Cpu => json!({"kind": "cpu"}),
            Device::Tt(shim) => {
                // What runs the ops: "host" (simulated), "mock" (tt-metal's mock cluster: no
                // device data), "silicon"; and the runtime (ttnn's version).
                let facts: Value = shim
                    .describe()
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or_default();
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
    /// [`open_tt`] also takes a parent when the shim sees more chips than one mesh needs.
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
}

/// Opens worker `worker`'s Tenstorrent mesh.
pub fn open_tt(
    shim: &Arc<Shim>,
    layout: MeshLayout,
    worker: usize,
    numerics: Numerics,
) -> anyhow::Result<TtMesh> {
    let mut placement = layout.placement(worker);
    // The port's rule: a direct 1xN open only when exactly N chips are visible; with more, a
    // parent over the visible chips (a multiple of N, at most 1x4 on a line) and the submesh
    // at the configured offset ("path A"; a direct 1x2 open timed out on a 4-chip box).
    if placement.parent_cols.is_none() {
        let visible = shim.visible_devices()? as usize;
        let cols = layout.shape.cols;
        let parent = (visible.min(4) / cols) * cols;
        if parent > cols {
            placement.parent_cols = Some(parent);
        }
    }
    TtMesh::open(shim, placement, numerics).with_context(|| {
        format!(
            "opening the {} mesh of worker {worker} through {}",
            layout.shape,
            shim.path().display()
        )
    })
}

/// Runs `$body` with `$open: impl Fn(usize) -> anyhow::Result<B>` opening worker `i`'s mesh
/// of the chosen device, for `B` = the CPU mesh or the Tenstorrent mesh.
macro_rules! on_device {
    ($device:expr, $layout:expr, $numerics:expr, |$open:ident| $body:expr) => {{
        let layout: $crate::cli::device::MeshLayout = $layout;
        let numerics: clef_device::Numerics = $numerics;
        match $device {
            $crate::cli::device::Device::Cpu => {
                let $open = move |_worker: usize| -> anyhow::Result<clef_device::cpu::CpuMesh> {
                    Ok(clef_device::cpu::CpuMesh::new(layout.shape).with_numerics(numerics))
                };
                $body
            }
            $crate::cli::device::Device::Tt(shim) => {
                let shim = shim.clone();
                let $open = move |worker: usize| {
                    $crate::cli::device::open_tt(&shim, layout, worker, numerics)
                };
                $body
            }
        }
    }};
}
pub(crate) use on_device;

/// `clef-tt devices --check`: the device's backend loads, no device touched (for `tt`: the
/// shim, its embedded CPython, ttnn and the op package, all started by the backend's
/// `describe`, which reports the chips it sees without opening them); an error naming what
/// failed otherwise.
pub fn check(args: &DeviceArgs) -> anyhow::Result<String> {
    match args.resolve()? {
        Device::Cpu => Ok("device: cpu: ok\n".into()),
        Device::Tt(shim) => {
            let facts: serde_json::Value =
                serde_json::from_str(&shim.describe().with_context(|| {
                    format!("the shim {} does not start", shim.path().display())
                })?)?;
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

/// `clef-tt devices`: prints what the asked device offers; an error when it cannot be used.
pub fn report(args: &DeviceArgs) -> anyhow::Result<String> {
    let mut out = String::new();
    let device = args.resolve()?;
    match &device {
        Device::Cpu => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            out.push_str(&format!(
                "device: cpu (the clef-device CPU mesh: 1x1, or 1x2 simulated devices)\ncores: {cores}\nvector units: {}\nkernels: {}\n",
                cpu_features(),
                clef_device::cpu::isa::isa().name()
            ));
        }
        Device::Tt(shim) => {
            let facts: serde_json::Value = serde_json::from_str(&shim.describe()?)?;
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
            let mut failed = Vec::new();
            if visible >= 4 {
                let sub = MeshPlacement {
                    shape: MeshShape::PAIR,
                    parent_cols: Some(4),
                    submesh_offset: 0,
                };
                match TtMesh::open(shim, sub, Numerics::default()).and_then(|m| mesh_line(&m)) {
                    Ok(line) => out.push_str(&format!("1x2 submesh of a 1x4 parent: {line}\n")),
                    Err(e) => {
                        out.push_str(&format!(
                            "1x2 submesh of a 1x4 parent: does not open: {e}\n"
                        ));
                        failed.push("1x4-parent".to_string());
                    }
                }
            }
            for shape in [MeshShape::ONE, MeshShape::PAIR] {
                if shape.devices() > visible as usize {
                    out.push_str(&format!(
                        "{shape} mesh: needs {} devices, {visible} visible\n",
                        shape.devices()
                    ));
                    continue;
                }
                match TtMesh::open(shim, MeshPlacement::direct(shape), Numerics::default())
                    .and_then(|m| mesh_line(&m))
                {
                    Ok(line) => out.push_str(&format!("{shape} mesh: {line}\n")),
                    Err(e) => {
                        out.push_str(&format!("{shape} mesh: does not open: {e}\n"));
                        failed.push(shape.to_string());
                    }
                }
            }
            if !failed.is_empty() {
                print!("{out}");
                anyhow::bail!("the {} mesh cannot be opened", failed.join(" and "));
            }
        }
    }
    Ok(out)
}

/// "opens (devices [..])" and what the backend tells of the open mesh (grid, device memory).
fn mesh_line(m: &TtMesh) -> clef_device::Result<String> {
    let status = m.status()?;
    let facts: serde_json::Value = serde_json::from_str(&m.describe()?).unwrap_or_default();
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
        let mut f = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512f") {
            f.push("avx512f");
        }
        if std::arch::is_x86_feature_detected!("avx512bf16") {
            f.push("avx512bf16");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            f.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            f.push("fma");
        }
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
