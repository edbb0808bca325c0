//! The Auth service, forwarded to etcd as it is, with the caller's token. A token a
//! client gets through the proxy is etcd's; the client's later calls carry it and are
//! forwarded with it. A change that succeeds (users, roles, permissions, auth on or off)
//! drops every cached decision at once (`authz/`), without waiting for the poll.

use std::sync::Arc;

use crate::forward_macros::forward;

/// `forward!`, then: etcd's auth state moved, so decisions are dropped (and for auth
/// on/off, learned again).
macro_rules! forward_changing {
    ($method:ident, $client:ident, $req:ty, $resp:ty, $learn:expr) => {
        fn $method<'life0, 'async_trait>(
            &'life0 self,
            req: tonic::Request<$req>,
        ) -> ::std::pin::Pin<
            Box<
                dyn ::std::future::Future<Output = Result<tonic::Response<$resp>, tonic::Status>>
                    + Send
                    + 'async_trait,
            >,
        >
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            Box::pin(async move {
                let metadata = req.metadata().clone();
                let resp = $crate::forward_macros::call_upstream!(
                    &self.state.upstream,
                    &metadata,
                    req.into_inner(),
                    $client.$method
                )
                .await
                .map($crate::upstream::fresh)?;
                if $learn {
                    let _ = self.state.authz.learn().await;
                }
                self.state.authz.invalidate();
                Ok(resp)
            })
        }
    };
}
use crate::pb::etcdserverpb::*;
use crate::state::State;

/// etcd's Auth service, forwarded.
pub(crate) struct AuthService {
    state: Arc<State>,
}

impl AuthService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        AuthService { state }
    }
}

#[tonic::async_trait]
impl auth_server::Auth for AuthService {
    forward_changing!(
        auth_enable,
        auth,
        AuthEnableRequest,
        AuthEnableResponse,
        true
    );
    forward_changing!(
        auth_disable,
        auth,
        AuthDisableRequest,
        AuthDisableResponse,
        true
    );
    forward!(auth_status, auth, AuthStatusRequest, AuthStatusResponse);
    forward!(
        authenticate,
        auth,
        AuthenticateRequest,
        AuthenticateResponse
    );
    forward_changing!(
        user_add,
        auth,
        AuthUserAddRequest,
        AuthUserAddResponse,
        false
    );
    forward!(user_get, auth, AuthUserGetRequest, AuthUserGetResponse);
    forward!(user_list, auth, AuthUserListRequest, AuthUserListResponse);
    forward_changing!(
        user_delete,
        auth,
        AuthUserDeleteRequest,
        AuthUserDeleteResponse,
        false
    );
    forward_changing!(
        user_change_password,
        auth,
        AuthUserChangePasswordRequest,
        AuthUserChangePasswordResponse,
        false
    );
    forward_changing!(
        user_grant_role,
        auth,
        AuthUserGrantRoleRequest,
        AuthUserGrantRoleResponse,
        false
    );
    forward_changing!(
        user_revoke_role,
        auth,
        AuthUserRevokeRoleRequest,
        AuthUserRevokeRoleResponse,
        false
    );
    forward_changing!(
        role_add,
        auth,
        AuthRoleAddRequest,
        AuthRoleAddResponse,
        false
    );
    forward!(role_get, auth, AuthRoleGetRequest, AuthRoleGetResponse);
    forward!(role_list, auth, AuthRoleListRequest, AuthRoleListResponse);
    forward_changing!(
        role_delete,
        auth,
        AuthRoleDeleteRequest,
        AuthRoleDeleteResponse,
        false
    );
    forward_changing!(
        role_grant_permission,
        auth,
        AuthRoleGrantPermissionRequest,
        AuthRoleGrantPermissionResponse,
        false
    );
    forward_changing!(
        role_revoke_permission,
        auth,
        AuthRoleRevokePermissionRequest,
        AuthRoleRevokePermissionResponse,
        false
    );
}
