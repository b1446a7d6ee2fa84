"""Tracker name -> "module:Class" (`log.report_to` names these): checking a name imports no tracker."""

from tinyrl.registry import Registry

TRACKERS = Registry("log.report_to", {
    "trackio": "tinyrl.trackers.trackio_tracker:TrackioTracker",
    "wandb": "tinyrl.trackers.wandb_tracker:WandbTracker",
    "tensorboard": "tinyrl.trackers.tensorboard_tracker:TensorBoardTracker",
})
