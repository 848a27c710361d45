//! The process group of a stdio server, killed with its connection.

use toolmesh_process::ProcessTag;

/// Kills a stdio server's whole process tree when dropped: its process group and every
/// descendant carrying its tag, also those that left the group. A server that exits by
/// itself (rmcp closes stdio servers gracefully) would otherwise leave its children behind.
pub struct ProcessGroupGuard {
    pub(crate) group: i32,
    pub(crate) tag: ProcessTag,
}

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        toolmesh_process::release(self.group.unsigned_abs());
        // ESRCH (nothing left in the group) is the usual, harmless outcome.
        let group = nix::unistd::Pid::from_raw(self.group);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let (group, tag) = (self.group, self.tag.clone());
        let stragglers = move || toolmesh_process::kill_tree(Some(group), &tag);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(stragglers)),
            Err(_) => drop(std::thread::spawn(stragglers)),
        }
    }
}
