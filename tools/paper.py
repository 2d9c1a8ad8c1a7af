"""The published tables tools/plan.py is checked against, as data: the zero-bubble paper's settings and bubble rates
(Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, arXiv 2401.10241: Tables 9 and 5, as its repository's
megatron/core/pipeline_parallel/efficiency.py prints them), and its memory model's M_W / M_B.

ROWS            p, m, T_F, T_B, T_W, T_comm (microseconds; the paper calls I 'B', so T_B is an I's time), h, a, then
                the rates of 1F1B, ZB-H1, ZB-H2, ZB-1p, ZB-2p
weight_memory   M_W / M_B for a transformer layer of hidden size h, a heads and sequence length s
"""

from typing import NamedTuple


class Row(NamedTuple):
    """One setting of Table 9 and its rates in Table 5: p stages, m micro-batches, a stage's measured times, the
    model's h and a (s = 1024), and each schedule's bubble rate, 1 - m (T_F + T_B + T_W) over the longest stage's
    time from its first F to its last W."""
    p: int
    m: int
    forward: int
    input_grad: int  # T_B: our I
    weight: int
    message: int
    h: int
    a: int
    one_f_one_b: float
    zb_h1: float
    zb_h2: float
    zb_1p: float
    zb_2p: float


ROWS = [Row(*row) for row in [
    (8, 24, 18522, 18086, 9337, 601, 2304, 24, 0.2431, 0.1585, 0.1083, 0.1585, 0.0433),
    (8, 32, 18513, 18086, 9331, 626, 2304, 24, 0.1985, 0.1242, 0.0837, 0.1242, 0.0039),
    (8, 64, 18546, 18097, 9321, 762, 2304, 24, 0.1240, 0.0674, 0.0444, 0.0674, 0.0026),
    (8, 24, 29718, 29444, 19927, 527, 4096, 32, 0.2347, 0.1323, 0.0698, 0.1323, 0.0029),
    (8, 32, 29802, 29428, 19530, 577, 4096, 32, 0.1898, 0.1045, 0.0559, 0.1045, 0.0022),
    (8, 64, 29935, 29621, 19388, 535, 4096, 32, 0.1091, 0.0554, 0.0294, 0.0554, 0.0010),
    (16, 48, 11347, 11248, 8132, 377, 5120, 40, 0.2552, 0.1397, 0.0672, 0.1397, 0.0066),
    (16, 64, 11307, 11254, 8101, 379, 5120, 40, 0.2082, 0.1088, 0.0516, 0.1088, 0.0054),
    (16, 128, 11325, 11308, 8109, 378, 5120, 40, 0.1251, 0.0576, 0.0266, 0.0576, 0.0028),
    (32, 96, 10419, 10207, 7715, 408, 6144, 48, 0.2646, 0.1421, 0.0641, 0.1421, 0.0038),
    (32, 128, 10408, 10204, 7703, 408, 6144, 48, 0.2168, 0.1106, 0.0490, 0.1106, 0.0029),
    (32, 256, 10402, 10248, 7698, 460, 6144, 48, 0.1352, 0.0594, 0.0257, 0.0594, 0.0018),
]]


def weight_memory(h, a, s=1024):
    """The paper's M_W / M_B for a transformer layer: 32h / (34h + 5as)."""
    return 32 * h / (34 * h + 5 * a * s)
