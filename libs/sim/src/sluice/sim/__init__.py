"""The simulator and capacity planner: the production scheduling code (the
engine's iteration scheduler and block manager, the cluster scheduler's
admission and placement) advanced on a virtual clock, with a first-principles
cost model of each engine step in place of a GPU.

Pure and torch-free: nothing here touches a socket, a thread or the wall
clock, and the policy modules it drives import nothing from it.
"""
