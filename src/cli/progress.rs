//! Progress bars on stderr (hidden when stderr is not a terminal) for long loads.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar labelled `label`; the returned closure reports `(done, total)`.
pub fn bar(label: &str) -> (ProgressBar, impl Fn(usize, usize)) {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(label.to_string());
    let report = {
        let pb = pb.clone();
        move |done: usize, total: usize| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }
    };
    (pb, report)
}

/// A bar cleared from the terminal when dropped.
pub struct Cleared(pub ProgressBar);

impl Drop for Cleared {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
