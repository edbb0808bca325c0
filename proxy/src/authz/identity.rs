//! The start check of the proxy's own etcd identity: it feeds the cache, so it must not be
//! root (unless `--allow-root-upstream`).

use tonic::Status;

use crate::etcd_errors::is_auth_refusal;
use crate::upstream::Upstream;

/// Refuses to start when the proxy's own etcd identity (`--user`, or the CN of `--cert`,
/// each checked on its own) has etcd's root role, unless `--allow-root-upstream`: that
/// identity feeds the cache, so it needs read on the cached prefix and nothing else.
///
/// `--user` is looked up with its own token, and the CN as the CN itself (a call over the
/// certificate with no token): etcd lets every user read its own entry, so a root CN is
/// found whatever `--user` may read.
pub(crate) async fn check_upstream_identity(
    upstream: &Upstream,
    config: &crate::config::Config,
) -> crate::error::Result<()> {
    use crate::pb::etcdserverpb::AuthUserGetRequest;
    if let Some(name) = upstream.user() {
        let req = AuthUserGetRequest {
            name: name.to_string(),
        };
        let answer = upstream
            .own_call(req, |q| {
                let mut c = upstream.auth();
                async move { c.user_get(q).await }
            })
            .await;
        judge_identity(config, name, "--user", answer)?;
    }
    if let Some(cn) = upstream.cert_identity() {
        let req = upstream.certificate_request(AuthUserGetRequest {
            name: cn.to_string(),
        });
        let answer = upstream.auth().user_get(req).await;
        judge_identity(config, cn, "the CN of --cert", answer)?;
    }
    Ok(())
}

/// Whether `name`'s roles (etcd's answer to its `UserGet`) may be the proxy's identity.
fn judge_identity(
    config: &crate::config::Config,
    name: &str,
    what: &str,
    answer: Result<tonic::Response<crate::pb::etcdserverpb::AuthUserGetResponse>, Status>,
) -> crate::error::Result<()> {
    use crate::error::Error;
    match answer {
        Ok(r) if r.get_ref().roles.iter().any(|r| r == "root") => {
            let who = format!("{what} ({name:?})");
            if !config.allow_root_upstream {
                return Err(Error::RootUpstream(who));
            }
            tracing::warn!("{who} has etcd's root role (--allow-root-upstream)");
            Ok(())
        }
        Ok(_) => Ok(()),
        // Not an etcd user (yet): not root. A refusal of a user's own entry: no user
        // etcd knows (an empty CN, an expired token), so not root either.
        Err(s) if s.message().contains("user name not found") || is_auth_refusal(&s) => {
            tracing::debug!(user = %name, error = %s.message(), "identity check");
            Ok(())
        }
        Err(s) => Err(Error::IdentityCheck {
            user: name.to_string(),
            status: s,
        }),
    }
}
