//! Child processes that never outlive what they were started for.
//!
//! toolmesh starts processes of its own (command tools, stdio MCP servers), and those start
//! others. A descendant can leave its process group (`setsid`) and be reparented away, so
//! killing the group is not enough. This crate makes toolmesh a *child subreaper*
//! (`PR_SET_CHILD_SUBREAPER`): every orphaned descendant becomes toolmesh's child instead
//! of init's. Then:
//!
//! - [`spawn`] starts a process with a [`ProcessTag`] in its environment, which its
//!   descendants inherit, and registers it as managed (tokio waits for it);
//! - [`kill_tree`] kills a process's group and every descendant that carries its tag,
//!   wherever it went, and reaps those that were reparented to toolmesh;
//! - a reaper thread reaps every other child that exits and that no one waits for, so an
//!   orphan never lingers as a zombie.

use std::{
    collections::HashSet,
    io,
    sync::{Mutex, MutexGuard, Once, PoisonError},
    time::{Duration, Instant},
};

use nix::{
    sys::{
        signal::{Signal, kill, killpg},
        wait::{WaitPidFlag, waitpid},
    },
    unistd::Pid,
};
use tracing::{debug, warn};

/// The environment variable that carries a process tree's tag.
pub const TAG_VAR: &str = "TOOLMESH_PROCESS_TAG";
/// How often the reaper looks for children that exited unwaited.
const REAP_EVERY: Duration = Duration::from_millis(200);
/// Longest time [`kill_tree`] waits for a killed tree to be gone.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Pids of the children something waits for (tokio's `Child`); the reaper leaves them be.
/// Spawning and reaping hold the lock, so the reaper never sees a managed child before it
/// is registered.
static MANAGED: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

fn managed() -> MutexGuard<'static, Option<HashSet<i32>>> {
    MANAGED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What marks every process of one tree: a random token in [`TAG_VAR`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessTag(String);

impl ProcessTag {
    /// Returns a new, unique tag.
    pub fn new() -> Self {
        ProcessTag(uuid::Uuid::now_v7().simple().to_string())
    }

    /// Returns the tag's value, as it appears in the environment.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ProcessTag {
    fn default() -> Self {
        Self::new()
    }
}

/// Makes this process the subreaper of its descendants and starts the reaper thread, once.
pub fn adopt_orphans() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
            warn!(%error, "cannot become a child subreaper: a descendant that leaves its process group can outlive its call");
            return;
        }
        managed().get_or_insert_with(HashSet::new);
        let started = std::thread::Builder::new().name("toolmesh-reaper".into()).spawn(|| {
            let mut seen = HashSet::new();
            loop {
                std::thread::sleep(REAP_EVERY);
                seen = reap_orphans(&seen);
            }
        });
        if let Err(error) = started {
            warn!(%error, "cannot start the reaper thread: orphaned descendants may linger as zombies");
        }
    });
}

/// Starts `command` tagged with `tag` and registered as managed (call [`release`] once
/// it has been waited for). The spawn holds the registry's lock, so the reaper cannot
/// take the new child's exit status from tokio.
pub fn spawn(
    command: &mut tokio::process::Command,
    tag: &ProcessTag,
) -> io::Result<tokio::process::Child> {
    command.env(TAG_VAR, tag.as_str());
    spawn_managed(|| command.spawn(), |child| child.id())
}

/// Runs `start`, which starts one child process, under the registry's lock, and registers
/// the pid that `pid` finds in its result; for children that a library starts.
pub fn spawn_managed<T>(
    start: impl FnOnce() -> io::Result<T>,
    pid: impl FnOnce(&T) -> Option<u32>,
) -> io::Result<T> {
    adopt_orphans();
    let mut guard = managed();
    let started = start()?;
    if let (Some(set), Some(id)) =
        (guard.as_mut(), pid(&started).and_then(|p| i32::try_from(p).ok()))
    {
        set.insert(id);
    }
    Ok(started)
}

/// Forgets a managed child whose exit status has been collected (or will be by tokio).
pub fn release(pid: u32) {
    if let (Some(set), Ok(pid)) = (managed().as_mut(), i32::try_from(pid)) {
        set.remove(&pid);
    }
}

/// Returns the direct children of this process.
fn children() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut pids = Vec::new();
    for task in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else { continue };
        pids.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    pids
}

/// Returns the state letter of process `pid` (`Z` for a zombie), if it exists.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// Returns whether process `pid` carries `tag` in its environment.
fn carries(pid: i32, tag: &ProcessTag) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
    let wanted = format!("{TAG_VAR}={}", tag.as_str());
    environ.split(|b| *b == 0).any(|entry| entry == wanted.as_bytes())
}

/// Reaps the children that exited, that nothing waits for, and that were zombies already
/// at the last look (`before`); returns the zombies it left for the next look. Waiting one
/// look lets a child that something does wait for (one this process started without
/// [`spawn`], say) be reaped by its owner first.
fn reap_orphans(before: &HashSet<i32>) -> HashSet<i32> {
    let guard = managed();
    let Some(set) = guard.as_ref() else { return HashSet::new() };
    let mut waiting = HashSet::new();
    for pid in children() {
        if set.contains(&pid) || state(pid) != Some('Z') {
            continue;
        }
        if before.contains(&pid) {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            debug!(pid, "reaped an orphaned descendant");
        } else {
            waiting.insert(pid);
        }
    }
    waiting
}

/// Reaps `pids`, descendants that [`kill_tree`] killed and that were reparented here.
fn reap(pids: &[i32]) {
    let guard = managed();
    let Some(set) = guard.as_ref() else { return };
    for pid in pids.iter().filter(|pid| !set.contains(pid)) {
        let _ = waitpid(Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG));
    }
}

/// Kills the tree of a process: its process group `group` (its pid, for a process started
/// as a group leader) and every descendant that carries `tag`, also those that left the
/// group and were reparented to toolmesh, and reaps those. Blocks until the tree is gone
/// or [`KILL_WAIT`] has passed: call it from a blocking thread.
pub fn kill_tree(group: Option<i32>, tag: &ProcessTag) {
    if let Some(group) = group {
        // ESRCH (nothing left in the group) is the usual, harmless outcome.
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
    let deadline = Instant::now() + KILL_WAIT;
    let mut killed = Vec::new();
    loop {
        // A descendant whose parent dies only now is reparented here a moment later, so
        // look until the group leader is gone and a look finds no one tagged.
        let leader_alive = group.is_some_and(|g| matches!(state(g), Some(s) if s != 'Z'));
        let tagged: Vec<i32> = children()
            .into_iter()
            .filter(|pid| state(*pid).is_some_and(|s| s != 'Z') && carries(*pid, tag))
            .collect();
        for pid in &tagged {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        killed.extend(&tagged);
        let settled = tagged.is_empty() && !leader_alive;
        if settled || Instant::now() >= deadline {
            if !settled {
                warn!(tag = tag.as_str(), "a process tree did not go within {KILL_WAIT:?}");
            }
            killed.sort_unstable();
            killed.dedup();
            reap(&killed);
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
