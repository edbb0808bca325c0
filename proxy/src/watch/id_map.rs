//! Maps and sets keyed by watch id, for every file of the watch path.

/// A map keyed by watch id. These are looked up once or more per response sent, and
/// std's default SipHash was a visible share of the proxy's CPU under load; foldhash
/// (randomly seeded per map) is several times faster. A watch id is the client's own
/// choice, and a map holds one stream's watches only.
pub(crate) type IdMap<V> = std::collections::HashMap<i64, V, foldhash::quality::RandomState>;
/// A set of watch ids (see [`IdMap`]).
pub(crate) type IdSet = std::collections::HashSet<i64, foldhash::quality::RandomState>;
