//! The Auth service, forwarded to etcd as it is. A token a client gets through the proxy
//! is etcd's; the client's later calls carry it and are forwarded with it.

use std::sync::Arc;

use crate::forward::forward;
use crate::pb::etcdserverpb::*;
use crate::state::State;

/// etcd's Auth service, forwarded.
pub(crate) struct AuthService {
    st: Arc<State>,
}

impl AuthService {
    pub(crate) fn new(st: Arc<State>) -> Self {
        AuthService { st }
    }
}

#[tonic::async_trait]
impl auth_server::Auth for AuthService {
    forward!(auth_enable, auth, AuthEnableRequest, AuthEnableResponse);
    forward!(auth_disable, auth, AuthDisableRequest, AuthDisableResponse);
    forward!(auth_status, auth, AuthStatusRequest, AuthStatusResponse);
    forward!(
        authenticate,
        auth,
        AuthenticateRequest,
        AuthenticateResponse
    );
    forward!(user_add, auth, AuthUserAddRequest, AuthUserAddResponse);
    forward!(user_get, auth, AuthUserGetRequest, AuthUserGetResponse);
    forward!(user_list, auth, AuthUserListRequest, AuthUserListResponse);
    forward!(
        user_delete,
        auth,
        AuthUserDeleteRequest,
        AuthUserDeleteResponse
    );
    forward!(
        user_change_password,
        auth,
        AuthUserChangePasswordRequest,
        AuthUserChangePasswordResponse
    );
    forward!(
        user_grant_role,
        auth,
        AuthUserGrantRoleRequest,
        AuthUserGrantRoleResponse
    );
    forward!(
        user_revoke_role,
        auth,
        AuthUserRevokeRoleRequest,
        AuthUserRevokeRoleResponse
    );
    forward!(role_add, auth, AuthRoleAddRequest, AuthRoleAddResponse);
    forward!(role_get, auth, AuthRoleGetRequest, AuthRoleGetResponse);
    forward!(role_list, auth, AuthRoleListRequest, AuthRoleListResponse);
    forward!(
        role_delete,
        auth,
        AuthRoleDeleteRequest,
        AuthRoleDeleteResponse
    );
    forward!(
        role_grant_permission,
        auth,
        AuthRoleGrantPermissionRequest,
        AuthRoleGrantPermissionResponse
    );
    forward!(
        role_revoke_permission,
        auth,
        AuthRoleRevokePermissionRequest,
        AuthRoleRevokePermissionResponse
    );
}
