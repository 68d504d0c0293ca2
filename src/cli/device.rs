//! The device a command runs on (`--device cpu|tt`, `--tt-shim`), as a
//! [`clef_device::select::Backend`]; [`on_device!`] instantiates a command written once over
//! `MeshOps` for the chosen backend, with a function that opens worker `i`'s mesh.

use super::args::DeviceArgs;
use clef_device::select::Backend;
use clef_device::tt::Shim;
use clef_tt::precision::Precision;

impl DeviceArgs {
    /// The backend, with its shim loaded (and checked) for `tt`; tt-metal's log and generated
    /// files kept out of stdout and the working directory (`clef_device::tt::output`).
    pub fn resolve(&self) -> anyhow::Result<Backend> {
        self.load(true)
    }

    /// [`DeviceArgs::resolve`] for `serve`: tt-metal's log stays where tt-metal writes it (the
    /// service's log); only its generated files move.
    pub fn resolve_for_serving(&self) -> anyhow::Result<Backend> {
        self.load(false)
    }

    fn load(&self, log_to_file: bool) -> anyhow::Result<Backend> {
        match self.device.as_str() {
            "tt" => {
                clef_device::tt::output::place(log_to_file);
                Ok(Backend::Tt(Shim::load(self.tt_shim.as_deref())?))
            }
            _ => Ok(Backend::Cpu),
        }
    }
}

/// The precision profile asked for, else the backend's default (the reference's f32 on the
/// CPU, the port's `selected` on Tenstorrent).
pub fn precision(backend: &Backend, asked: Option<&str>) -> anyhow::Result<Precision> {
    let default = match backend {
        Backend::Cpu => "f32",
        Backend::Tt(_) => "selected",
    };
    Ok(Precision::from_env(asked.unwrap_or(default))?)
}

/// Runs `$body` with `$open: impl Fn(usize) -> anyhow::Result<B>` opening worker `i`'s mesh
/// of the chosen backend, for `B` = the CPU mesh or the Tenstorrent mesh.
macro_rules! on_device {
    ($device:expr, $layout:expr, $numerics:expr, |$open:ident| $body:expr) => {{
        let layout: clef_device::select::MeshLayout = $layout;
        let numerics: clef_device::Numerics = $numerics;
        match $device {
            clef_device::select::Backend::Cpu => {
                let $open = move |_worker: usize| -> anyhow::Result<clef_device::cpu::CpuMesh> {
                    Ok(clef_device::cpu::CpuMesh::new(layout.shape).with_numerics(numerics))
                };
                $body
            }
            clef_device::select::Backend::Tt(shim) => {
                let shim = shim.clone();
                let $open = move |worker: usize| -> anyhow::Result<clef_device::tt::TtMesh> {
                    Ok(layout.open_tt(&shim, worker, numerics)?)
                };
                $body
            }
        }
    }};
}
pub(crate) use on_device;
