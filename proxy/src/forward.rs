//! `forward!`: one unary call passed to etcd as it is (the services that have nothing
//! to rewrite are lists of these), and `unserved!`. Both expand to the form
//! `#[async_trait]` gives a method, since the attribute runs before these macros do.

/// Implements a unary method of a generated service trait by forwarding the request to
/// the same method of the upstream client `$client` (a method of `Upstream`).
macro_rules! forward {
    ($method:ident, $client:ident, $req:ty, $resp:ty) => {
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
                let md = req.metadata().clone();
                let up = &self.st.up;
                up.call(&md, req.into_inner(), |q| {
                    let mut c = up.$client();
                    async move { c.$method(q).await }
                })
                .await
                .map($crate::upstream::fresh)
            })
        }
    };
}

/// Implements a unary method that this proxy does not serve.
macro_rules! unserved {
    ($method:ident, $req:ty, $resp:ty, $what:literal) => {
        fn $method<'life0, 'async_trait>(
            &'life0 self,
            _req: tonic::Request<$req>,
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
            Box::pin(async move { Err($crate::status::unimplemented($what)) })
        }
    };
}

pub(crate) use {forward, unserved};
