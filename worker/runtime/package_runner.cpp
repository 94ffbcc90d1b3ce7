// PackageRunner: an AOTInductor package loaded and run through torch's C++ loader, as a TorchScript custom
// class. torch releases the GIL around a custom class's method calls from Python, so a CPU run computes
// while the worker's other threads go on (worker/runtime/package_runner.py says why that matters).
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/custom_class.h>
#include <torch/library.h>

namespace {

struct PackageRunner : torch::CustomClassHolder {
  PackageRunner(const std::string& path, int64_t runners, int64_t device_index)
      : loader(std::make_unique<torch::inductor::AOTIModelPackageLoader>(
            path, "model", /*run_single_threaded=*/false, static_cast<size_t>(runners),
            static_cast<c10::DeviceIndex>(device_index))) {}

  // The package's flat tensor inputs to its flat tensor outputs.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) { return loader->boxed_run(std::move(inputs)); }

  // The serialized pytree specs of the inputs and outputs (torch.utils._pytree.treespec_loads).
  std::vector<std::string> call_spec() { return loader->get_call_spec(); }

  std::vector<std::string> constant_fqns() { return loader->get_constant_fqns(); }

  // user_managed: the package uses the tensors in place, so the caller keeps them alive.
  void load_constants(c10::Dict<std::string, at::Tensor> constants, bool check_full_update, bool user_managed) {
    std::unordered_map<std::string, at::Tensor> map;
    for (const auto& item : constants) {
      map.emplace(item.key(), item.value());
    }
    loader->load_constants(map, /*use_inactive=*/false, check_full_update, user_managed);
  }

  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
};

}  // namespace

TORCH_LIBRARY(boundserve_runner, m) {
  m.class_<PackageRunner>("PackageRunner")
      .def(torch::init<std::string, int64_t, int64_t>())
      .def("run", &PackageRunner::run)
      .def("call_spec", &PackageRunner::call_spec)
      .def("constant_fqns", &PackageRunner::constant_fqns)
      .def("load_constants", &PackageRunner::load_constants);
}
