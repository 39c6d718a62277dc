// The default process group: torch.distributed's module-level API.
//
//   // launched as: loomrun --nproc_per_node 2 ./train
//   loom::distributed::init_process_group("gloo");     // reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Tensor loss_sum = ...;
//   loom::distributed::all_reduce(loss_sum);            // sum over every rank, in place
//   if (loom::distributed::is_main_process()) print(loss_sum);
//   loom::distributed::destroy_process_group();
//
// init_method "env://" reads the environment that loomrun (or torchrun) sets:
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and LOCAL_RANK (optional, defaults to
// RANK). "tcp://host:port" names the store directly; rank and world_size then come
// from the arguments (or RANK / WORLD_SIZE). Rank 0 serves the store.
//
// Across machines, Gloo needs each rank's reachable address: GLOO_SOCKET_IFNAME names a
// network interface (as with PyTorch); otherwise loom uses 127.0.0.1 when MASTER_ADDR is a
// loopback address, this machine's host name when it resolves to one of its own
// non-loopback addresses, else the address it reaches MASTER_ADDR from (Note [Which
// address a rank gives Gloo] in gloo_address.h).
// When every rank runs on this machine, the gloo backend's collectives go through shared
// memory (gloo_communicator.h); LOOM_GLOO_SHM=0 keeps them on TCP, and
// LOOM_DISTRIBUTED_DEBUG=info makes rank 0 say which transport was chosen and why.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/comm/communicator.h"
#include "parallel/comm/new_group.h"  // defines: World, new_group (subgroups of the default group)
#include "parallel/store/tcp_store.h"

namespace loom::distributed {

void init_process_group(const std::string& backend = "gloo", const std::string& init_method = "env://",
                        std::chrono::milliseconds timeout = kDefaultCommTimeout, int rank = -1,
                        int world_size = -1);
bool is_initialized();
// Waits (briefly) until every rank has arrived here, so that rank 0 does not stop the
// store under ranks still using it; then releases the group.
void destroy_process_group();

// The group made by init_process_group, for its asynchronous operations.
std::shared_ptr<Communicator> default_group();
// The store the default group met through; handy for small out-of-band exchanges.
std::shared_ptr<TCPStore> default_store();

int get_rank();
int get_world_size();
int get_local_rank();
// Rank 0 of the default group, or true when no group exists (a single-process run).
bool is_main_process();

// Synchronous conveniences on the default group.
void barrier();
void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
void broadcast(const Tensor& tensor, int root);

// The backend seam: makes a communicator of `backend` over `store`. "gloo" here; "nccl"
// is where the CUDA backend plugs in. `world_rank` (default: `rank`) is this process's
// rank in the whole world, which picks its GPU when LOCAL_RANK is not set: a subgroup's
// rank 0 is not world rank 0.
std::shared_ptr<Communicator> make_communicator(const std::string& backend, std::shared_ptr<TCPStore> store,
                                                const std::string& prefix, int rank, int world_size,
                                                std::chrono::milliseconds timeout, const std::string& master_addr,
                                                int world_rank = -1);

}  // namespace loom::distributed
