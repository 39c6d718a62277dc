// DeviceMesh: the world's ranks laid out as an n-dimensional array with named dimensions,
// and a process group along each dimension, as torch.distributed.device_mesh.
//
//   // loomrun --nproc_per_node 4 ./train
//   init_process_group("gloo");
//   DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"pp", "dp"});
//   //   mesh: [[0, 1],        rank 3 is at (pp 1, dp 1): its "dp" group is {2, 3},
//   //          [2, 3]]        its "pp" group is {1, 3}
//   auto dp = mesh.group("dp");            // all-reduce gradients with this stage's replicas
//   int stage = mesh.local_rank("pp");     // which pipeline stage this rank runs
//   int replicas = mesh.size("dp");
//
// The layout is row-major, as PyTorch's: world rank = sum over dims of coordinate[d] x
// stride[d], the last dimension varying fastest, so consecutive ranks (the ranks of one
// machine, under loomrun) share every coordinate but the last. Put the dimension whose
// traffic is heaviest last (data parallel's all-reduces over pipeline parallel's sends,
// as torchtitan's ["pp", "dp"] does), so that its groups stay inside a machine.
//
// Building a mesh is a collective: every rank of the world builds the same mesh, and it
// makes every group along every dimension — members or not — in the same order (Note
// [Groups are numbered by call order] in parallel/comm/new_group.h), keeping the ones
// that hold this rank.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"  // defines: Communicator
#include "parallel/comm/new_group.h"     // defines: World, new_group

namespace loom::distributed {

class DeviceMesh {
 public:
  // Makes one group of `ranks` named `name`; called for every group, members or not.
  using GroupMaker =
      std::function<std::shared_ptr<Communicator>(const std::vector<int>& ranks, const std::string& name)>;

  // The mesh over `world` (threads as ranks in tests; init_device_mesh for the default
  // group). dim_names may be empty: then the dims are named "0", "1", ...
  DeviceMesh(std::string device_type, std::vector<int> shape, std::vector<std::string> dim_names, World& world);
  DeviceMesh(std::string device_type, std::vector<int> shape, std::vector<std::string> dim_names, int rank,
             int world_size, const GroupMaker& make_group);

  const std::string& device_type() const { return device_type_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int>& shape() const { return shape_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  int rank() const { return rank_; }  // this process's world rank
  int size() const;                   // every rank of the mesh
  // `dim` below: a dimension's name, or a flattened group's (flatten()).
  int size(const std::string& dim) const;
  // This rank's coordinate along `dim`, which is its rank in group(dim).
  int local_rank(const std::string& dim) const;
  // The group of the ranks that share every coordinate with this one but `dim`'s.
  const std::shared_ptr<Communicator>& group(const std::string& dim) const;
  // The world ranks of group(dim), in group-rank order.
  std::vector<int> group_ranks(const std::string& dim) const;
  // Whether `dim` names a dimension or a flattened group of this mesh.
  bool has(const std::string& dim) const;

  // One group over several dimensions at once, named `name` (PyTorch's
  // mesh[dims]._flatten(name)): the ranks that share every coordinate with this one but
  // those of `dims`, ranked row-major over them. One dimension: its group, under a second
  // name. A collective, like the constructor (every rank, same order), through the
  // GroupMaker the mesh was built with (for the World constructor: while that World lives).
  void flatten(const std::vector<std::string>& dims, const std::string& name);
  const std::vector<int>& coordinate() const { return coordinate_; }

  // PyTorch's spellings of the same.
  const std::shared_ptr<Communicator>& get_group(const std::string& dim) const { return group(dim); }
  int get_local_rank(const std::string& dim) const { return local_rank(dim); }
  const std::vector<int>& get_coordinate() const { return coordinate_; }

  // DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('pp', 'dp')), as PyTorch prints it.
  std::string str() const;

 private:
  size_t index(const std::string& dim) const;  // a loom::Error naming the dims if unknown
  struct Flattened {
    std::string name;
    std::vector<size_t> dims;  // indices into shape_, outermost first
    std::shared_ptr<Communicator> group;
  };
  const Flattened* flattened(const std::string& name) const;  // null if not one

  std::string device_type_;
  std::vector<int> shape_;
  std::vector<std::string> dim_names_;
  int rank_;
  std::vector<int> coordinate_;
  std::vector<std::shared_ptr<Communicator>> groups_;  // one per dim
  std::vector<Flattened> flattened_;
  GroupMaker make_group_;
};

// The mesh over the default process group's world (after init_process_group), as
// torch.distributed.device_mesh.init_device_mesh. device_type: "cpu" or "cuda". The
// product of mesh_shape must equal the world size.
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {});

}  // namespace loom::distributed
