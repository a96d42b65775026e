//! The parameters of a module by their record field path (`layers.0.self_attn.q_proj.weight`).
//! The converter fills a freshly built model through these paths and the runtime checks a
//! loaded record's shapes against a freshly built one, so both read one source of truth: the
//! module definition in `model.rs`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `(path, shape)` of every float parameter of `module`, in visiting order. Reads shapes
/// without initialising lazy parameters.
pub fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    let mut visitor = ShapeVisitor {
        path: Vec::new(),
        found: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.found
}

struct ShapeVisitor {
    path: Vec<String>,
    found: Vec<(String, Vec<usize>)>,
}

impl<B: Backend> ModuleVisitor<B> for ShapeVisitor {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.found
            .push((self.path.join("."), param.lazy_shape().to_vec()));
    }
}
