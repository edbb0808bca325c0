//! The cache creates of a stream that wait for their `created`, in the order they were
//! made (the cache answers creates in that order). What each watch is and where it
//! stands is its entry's (`entries.rs`); this is only the queue.

/// A cache create waiting for its `created`: the id it was given and what its `created`
/// must do.
pub(super) struct PendingCreate {
    pub(super) id: i64,
    /// The client canceled it before its `created` came: its id is free (as etcd frees
    /// it when it reads the cancel; its entry is gone), and it is not counted as open.
    pub(super) canceled: bool,
    pub(super) fragment: bool,
    /// A watch caught up from etcd returning to the cache (`rejoin`): the client has had
    /// its `created` long ago, and did not ask for this one.
    pub(super) rejoin: bool,
}
