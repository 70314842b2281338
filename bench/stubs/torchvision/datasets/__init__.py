class VisionDataset:
    pass


class CIFAR10:
    pass
