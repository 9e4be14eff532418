// Translation of a ferry graph (or the split of one the scheduler hands over) into an
// ov::Model. One translator per op, in a table generated from ferry/ops.def (translate.cpp).
//
// Every ferry tensor becomes a dense OpenVINO value of shape [ne3, ne2, ne1, ne0]. Leaves are
// parameters bound to ferry's memory at run time (weights: constants over the converted
// memory of prepare_weights), dimensions the model marked dynamic are left open (their sizes
// are scalar parameters), views and permutes are reshapes/slices/transposes of values, never
// copies of memory. In-place writes (SET_ROWS, CPY) into ferry memory come out of the model as
// (flat element index, value) pairs that the backend stores after the run: a decode step
// writes its new KV rows, never the whole cache.
#pragma once

#include <memory>
#include <openvino/core/model.hpp>
#include <string>
#include <vector>

#include "ferry/graph.h"
#include "ferry/status.h"

namespace ferry::openvino {

struct ModelPlan {
    std::shared_ptr<ov::Model> model;  // released once compiled (the plugin keeps its own)
    // What each parameter (model->get_parameters() order) is bound to.
    struct Input {
        enum Kind { Leaf, DequantLeaf, Symbol, StridedLeaf } kind = Leaf;
        int leaf = -1;  // index in Graph::leafs (Leaf, DequantLeaf, StridedLeaf: its bytes, flat)
        int sym = 0;    // DimSymbol (Symbol)
        // Leaf bound by its first rows only: rows = the size of DimSymbol `window` this run
        // (a KV cache whose every reader is the attended window; 0: the whole leaf).
        int window = 0;
    };
    std::vector<Input> inputs;
    // What each result (model->get_results() order) is copied into.
    struct Output {
        enum Kind { Node, WriteIndex, WriteValue } kind = Node;
        int node = -1;  // Node: index in Graph::nodes, copied into its contiguous storage.
                        // WriteIndex/WriteValue: a pair of results (indices, then values) of the
                        // storage owner at leaf index `node`, elements stored after the run.
    };
    std::vector<Output> outputs;
    // FLASH_ATTN_EXT nodes translated to read their KV cache in place (translate.cpp,
    // attend_in_place) rather than through a copy of its window with this graph's rows in it.
    int attention_in_place = 0;
};

// Whether a translator takes this node (types and shapes it handles). Cheap.
bool translatable(const Tensor* node, std::string* why = nullptr);

// Test hook: whether attention over a KV cache reads it in place (default) or, as before,
// through a copy of its window with the graph's rows scattered in (to compare the two).
void set_attention_in_place(bool on);

// Builds the model for g. Fails (naming the node) when a node cannot be translated.
Expected<ModelPlan> translate_graph(const Graph& g);

}  // namespace ferry::openvino
